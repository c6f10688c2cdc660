"""`campaign demo` end to end, with a smaller budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from campaign.ledger import Ledger
from tests.launch_helpers import run


@pytest.mark.slow
def test_demo_plans_pilots_launches_and_reports(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    done = run("sqlite:///unused.db", "demo", "--dir", str(folder), "--updates", "40",
               "--seeds", "1", timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for line in ("data gate passed", "pilot", "report:"):
        assert line in done.stderr
    report = folder / "digits-lr-report.html"
    assert report.exists() and report.stat().st_size > 10_000
    with Ledger.open(f"sqlite:///{folder / 'campaign.db'}") as ledger:
        runs = ledger.runs("digits-lr").set_index("variant")
        assert len(runs) == 4
        assert runs.loc["lr-3e0", "status"] == "diverged"  # the honest failure is kept
        assert set(runs.drop(index="lr-3e0")["status"]) == {"completed"}
        assert ledger.pilot_passed("digits-lr")
    html = report.read_text()
    assert "lr-3e0" in html and "diverged" in html
    assert not Path("unused.db").exists()
