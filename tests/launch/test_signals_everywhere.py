"""SLURM signals every process of a job step at once: the supervisor, its task host and the
run's process get the same SIGTERM or SIGUSR2 in the same instant. Only the supervisor decides
what it means: the host ignores it, the run checkpoints at the update it was in and ends as
docs/runs.md says (``interrupted``, cause ``interrupted`` for SIGTERM, ``preempted`` for the
scheduler's USR2), and nothing is killed early. On SQLite and on PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from campaign.ledger import Ledger
from tests.support.loop_helpers import plan_loop

ACCUMULATION = 2
AT_MICROBATCH = 7  # the first microbatch of update 4: the signal arrives inside update 4


def _plan(ledger: Ledger, tmp_path: Path, signal_name: str) -> str:
    return plan_loop(
        ledger, f"tree-{signal_name.lower()}", task="tests.support.tasks.faulty:build",
        hold={"loop.microbatch": 4, "loop.accumulation": ACCUMULATION, "budget.updates": 40},
        config={"task.fault": "signal_tree", "task.at": AT_MICROBATCH,
                "task.signal": signal_name, "task.marker": str(tmp_path / "signalled"),
                "task.sleep": 0.02},
        validation={"every": 20},
    )[0]


def _supervise(url: str, run_id: str, artifacts: Path, signal_name: str) -> subprocess.Popen:
    if signal_name == "SIGTERM":  # `campaign run`: the command is the supervisor
        command = [sys.executable, "-m", "campaign", "--ledger", url, "run", run_id,
                   "--skip-pilot", "--reason", "signal test", "--artifacts", str(artifacts),
                   "--stop-grace-s", "60"]
    else:  # what a SLURM array task runs: a worker that reads USR2 as preemption
        command = [sys.executable, "-m", "campaign", "--ledger", url, "worker", "tree-sigusr2",
                   "--slurm", "--skip-pilot", "--reason", "signal test", "--artifacts",
                   str(artifacts), "--stop-grace-s", "60"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize(("signal_name", "cause"),
                         [("SIGTERM", "interrupted"), ("SIGUSR2", "preempted")])
def test_a_signal_to_every_process_checkpoints_and_interrupts(
    ledger_url: str, tmp_path: Path, signal_name: str, cause: str
) -> None:
    with Ledger.open(ledger_url, create=True) as ledger:
        run_id = _plan(ledger, tmp_path, signal_name)
    supervisor = _supervise(ledger_url, run_id, tmp_path / "art", signal_name)
    _, stderr = supervisor.communicate(timeout=300)
    assert (tmp_path / "signalled").exists(), stderr
    with Ledger.open(ledger_url) as ledger:
        run = ledger.run(run_id)
        artifacts = ledger.artifacts(run.campaign)
    signalled_in = (AT_MICROBATCH - 1) // ACCUMULATION + 1
    assert (run.status, run.stop_cause) == ("interrupted", cause), (run.stop_detail, stderr)
    assert run.stop_step == signalled_in, run.stop_detail  # it finished the update it was in
    assert "killed" not in str(run.stop_detail) and signal_name in str(run.stop_detail)
    checkpoints = artifacts[(artifacts["run_id"] == run_id) & (artifacts["kind"] == "checkpoint")]
    assert signalled_in in set(checkpoints["step"]), checkpoints[["step", "path"]]
