"""A run's process names its run in ``ps`` (issue 42, item 7): every task-host child was
``python -m campaign.host.host_process``, so an operator could not tell which run to look at."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from campaign.ledger import Ledger
from tests.support.loop_helpers import plan_loop

ROOT = Path(__file__).resolve().parents[2]


def test_a_runs_process_title_names_its_run(sqlite_url: str, tmp_path: Path) -> None:
    shown = tmp_path / "title"
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id = plan_loop(ledger, task="tests.support.tasks.faulty:build",
                           config={"task.title_to": str(shown)})[0]
    done = subprocess.run(
        [sys.executable, "-m", "campaign", "run", run_id, "--artifacts", str(tmp_path / "a"),
         "--skip-pilot", "--reason", "title"],
        cwd=ROOT, env={**os.environ, "CAMPAIGN_LEDGER": sqlite_url}, capture_output=True,
        text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    title = shown.read_bytes().replace(b"\0", b" ").decode().strip()
    assert title == f"campaign run {run_id}"
