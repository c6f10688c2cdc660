"""Passwords never reach a command line (issue 14): a launch on a PostgreSQL ledger whose URL
carries a password; every process it starts is read from /proc while runs train."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from campaign.ledger import Ledger
from tests.support.loop_helpers import plan_quick

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cret-pw-17"


def _all_command_lines() -> list[str]:
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    return lines


@pytest.mark.slow
def test_no_process_of_a_launch_shows_the_password(postgresql_url: str, tmp_path: Path) -> None:
    with Ledger.open(postgresql_url, create=True) as ledger:
        plan_quick(ledger, "secret", runs=3, updates=30, task={"sleep_s": 0.02})
    # trust authentication accepts any password: the URL carries one, as a team's would
    user, rest = postgresql_url.split("://", 1)[1].split("@", 1)
    with_password = f"postgresql+psycopg://{user}:{SECRET}@{rest}"
    env = {**os.environ, "CAMPAIGN_LEDGER": with_password, "OMP_NUM_THREADS": "1"}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "campaign", "launch", "secret", "--workers", "2", "--skip-pilot",
         "--reason", "secrets test", "--artifacts", str(tmp_path / "art")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    seen: list[str] = []
    try:
        while launcher.poll() is None:
            seen += [line for line in _all_command_lines() if "campaign" in line]
            time.sleep(0.2)
    finally:
        launcher.kill()
    _, stderr = launcher.communicate()
    assert launcher.returncode == 0, stderr
    assert any(" worker secret " in line for line in seen)  # the workers were seen running
    assert not [line for line in seen if SECRET in line]
    assert SECRET not in stderr
