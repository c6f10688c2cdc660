"""Faults of the world around a run (issue 26, item 12): a full artifacts volume and a
ledger locked past its busy timeout never end a run ``completed`` or ``failed`` for good. The
first ends it ``interrupted`` (nothing lost but the updates since its last checkpoint), and
the resume completes it exactly; a lock a run's process can wait out is waited out."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from campaign.ledger import Ledger
from campaign.loop.train import execute
from tests.support.launch_helpers import in_process
from tests.support.loop_helpers import plan_loop

FAULTY = "tests.support.tasks.faulty:build"


def _run(url: str, run_id: str, artifacts: Path, **env: str) -> subprocess.CompletedProcess:
    """``campaign run`` in this process (the run itself in a fresh child of the task host, which
    takes the command's environment: the busy timeout reaches it)."""
    return in_process("run", run_id, "--artifacts", str(artifacts), "--skip-pilot", "--reason",
                      "a fault of the world around the run", env={"CAMPAIGN_LEDGER": url, **env})


def _locked_from_update_5(url: str, tmp_path: Path, seconds: float,
                          **env: str) -> tuple[str, Any]:
    """A run whose ledger another process locks for ``seconds`` from update 5 on, run by
    ``campaign run`` with a busy timeout of 1 s: (its id, the finished command)."""
    marker = tmp_path / "locked"
    with Ledger.open(url, create=True) as ledger:
        run_id = plan_loop(ledger, task=FAULTY, config={
            "task.fault": "ledger_lock", "task.at": 10, "task.lock_s": seconds,
            "task.marker": str(marker)})[0]
    ended = _run(url, run_id, tmp_path / "a", CAMPAIGN_SQLITE_BUSY_TIMEOUT_S="1", **env)
    assert marker.exists(), ended.stderr  # the lock was really taken
    return run_id, ended


def _steps(ledger: Ledger) -> list[int]:
    return ledger.metrics("loop", keys=["train/loss"]).sort_values("step")["step"].tolist()


def test_a_full_artifacts_volume_ends_the_run_resumable(postgresql_url: str,
                                                        tmp_path: Path) -> None:
    """From update 5 on, the run's process can write no file over 4 KiB (EFBIG, what ENOSPC
    is on a full volume): its checkpoint at update 8 fails. The run ends ``interrupted``
    saying why and how to go on, the torn file is gone, and the resume (space back) continues
    from the checkpoint at update 4 to the budget with the unbroken run's curve. (PostgreSQL:
    the ledger is on another machine's disk, not the full volume.)"""
    marker, artifacts = tmp_path / "full", tmp_path / "a"
    with Ledger.open(postgresql_url, create=True) as ledger:
        run_id = plan_loop(ledger, task=FAULTY, config={
            "task.fault": "disk_full", "task.at": 10, "task.marker": str(marker)})[0]
    ended = _run(postgresql_url, run_id, artifacts)
    assert ended.returncode != 0, ended.stderr
    with Ledger.open(postgresql_url) as ledger:
        run = ledger.run(run_id)
        assert (run.status, run.stop_cause) == ("interrupted", "interrupted"), run
        assert "no space to write" in run.stop_detail and "File too large" in run.stop_detail
        assert f"campaign resume {run_id}" in run.stop_detail
        assert not list((artifacts / run_id / "checkpoints").glob(".*.partial"))
        outcome = execute(ledger, run_id, artifacts=artifacts, replay_in_subprocess=False)
        assert (outcome.status, outcome.step) == ("completed", 12)
        assert ledger.segments("loop")["start_step"].tolist() == [0, 4]
        assert sorted(set(_steps(ledger))) == list(range(1, 13))
        assert list(ledger.metrics("loop", keys=["val/accuracy"])["step"]) == [4, 8, 12]


@pytest.mark.slow
def test_a_ledger_lock_a_run_can_wait_out_is_waited_out(sqlite_url: str,
                                                        tmp_path: Path) -> None:
    """Another process holds the SQLite ledger's write lock for 2.5 busy timeouts (1 s here)
    from update 5 on: a command would give up after one; the run's process waits it out and
    the run completes with every update and validation recorded."""
    run_id, ended = _locked_from_update_5(sqlite_url, tmp_path, 2.5)
    assert ended.returncode == 0, ended.stderr
    with Ledger.open(sqlite_url) as ledger:
        run = ledger.run(run_id)
        assert (run.status, run.stop_cause, run.stop_step) == ("completed", "budget_reached", 12)
        assert _steps(ledger) == list(range(1, 13))
        assert list(ledger.metrics("loop", keys=["val/accuracy"])["step"]) == [4, 8, 12]


@pytest.mark.slow
def test_a_ledger_locked_past_the_run_patience_is_ridden_out_like_an_outage(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The lock is held longer than the run's process waits for one write (5 busy timeouts of
    1 s): the run trains on, keeping its points (a lock is an outage of the file to it), and
    completes with every update and validation once the lock is gone. Past
    CAMPAIGN_LEDGER_OUTAGE_S it would stop at a checkpoint, ``ledger_unreachable``
    (tests/ledger/test_outage.py); never ``failed``."""
    run_id, ended = _locked_from_update_5(sqlite_url, tmp_path, 7)
    assert ended.returncode == 0, ended.stderr
    with Ledger.open(sqlite_url) as ledger:
        run = ledger.run(run_id)
        assert (run.status, run.stop_cause, run.stop_step) == ("completed", "budget_reached", 12)
        assert _steps(ledger) == list(range(1, 13))
        assert list(ledger.metrics("loop", keys=["val/accuracy"])["step"]) == [4, 8, 12]
