"""A run's processes keep to themselves (issue 42, item 7): its process names its run in
``ps`` (every task-host child was ``python -m campaign.host.host_process``), and what its
replay prints goes to the run's log, not to the terminal of the command that launched it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from campaign.ledger import Ledger
from tests.support.loop_helpers import plan_loop

ROOT = Path(__file__).resolve().parents[2]


def _run(url: str, artifacts: Path, run_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "campaign", "run", run_id, "--artifacts", str(artifacts),
         "--skip-pilot", "--reason", "title"],
        cwd=ROOT, env={**os.environ, "CAMPAIGN_LEDGER": url}, capture_output=True,
        text=True, timeout=300)


def test_a_runs_process_title_names_its_run(sqlite_url: str, tmp_path: Path) -> None:
    shown = tmp_path / "title"
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id = plan_loop(ledger, task="tests.support.tasks.faulty:build",
                           config={"task.title_to": str(shown)})[0]
    done = _run(sqlite_url, tmp_path / "a", run_id)
    assert done.returncode == 0, done.stderr[-2000:]
    title = shown.read_bytes().replace(b"\0", b" ").decode().strip()
    assert title == f"campaign run {run_id}"


def test_a_replays_prints_go_to_the_runs_log(sqlite_url: str, tmp_path: Path) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id = plan_loop(ledger, task="tests.support.tasks.faulty:build",
                           config={"task.fault": "say_in_replay"})[0]
    done = _run(sqlite_url, tmp_path / "a", run_id)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "REPLAY-SAYS" not in done.stderr + done.stdout
    with Ledger.open(sqlite_url) as ledger:
        files = ledger.artifacts("loop")
        assert ledger.run(run_id).status == "completed"
    (log,) = files[files["kind"] == "log"]["path"]
    assert "REPLAY-SAYS" in Path(log).read_text()
