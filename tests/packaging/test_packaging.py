"""A non-editable install carries its migrations: `campaign db upgrade` works from any directory."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from campaign.ledger.migrate import head_revision

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_ships_migrations_and_upgrades_from_elsewhere(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    wheel = next(wheels.glob("campaign-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "campaign/migrations/env.py" in names
    assert "campaign/migrations/script.py.mako" in names
    assert any(n.startswith("campaign/migrations/versions/0001_") for n in names)
    for shipped in ("templates/campaign.html", "templates/base.html", "static/dashboard.js",
                    "static/dashboard.css", "static/vendor/uPlot.iife.min.js",
                    "static/vendor/uPlot.LICENSE"):
        assert f"campaign/serve/{shipped}" in names  # the dashboard works offline

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
         str(wheel)],
        check=True, capture_output=True, timeout=300,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "CAMPAIGN_LEDGER": "sqlite:///lab.db"}
    where = subprocess.run(
        [sys.executable, "-c", "import campaign; print(campaign.__file__)"],
        capture_output=True, text=True, env=env, cwd=elsewhere, check=True,
    )
    assert where.stdout.startswith(str(site)), "the test must exercise the installed wheel"
    upgrade = subprocess.run(
        [sys.executable, "-m", "campaign", "db", "upgrade"],
        capture_output=True, text=True, env=env, cwd=elsewhere,
    )
    assert upgrade.returncode == 0, upgrade.stderr
    assert f"upgraded from empty to {head_revision()}" in upgrade.stderr
    assert (elsewhere / "lab.db").exists()
    served = subprocess.run(  # the dashboard's pages render from the installed files
        [sys.executable, "-c", "from campaign.serve import pages; "
         "print(len(pages.render('campaigns.html', campaigns=[], ledger='x', "
         "page={'kind': 'campaigns'})))"],
        capture_output=True, text=True, env=env, cwd=elsewhere,
    )
    assert served.returncode == 0 and int(served.stdout) > 500, served.stderr
