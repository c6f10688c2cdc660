"""SLURM through submitit's local executor: a simulated preemption signal mid-run."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from campaign.launch.placement import options_document
from campaign.launch.worker import WorkerOptions
from campaign.ledger import Ledger
from campaign.loop.train import execute
from tests.conftest import require
from tests.launch_helpers import ROOT, last_step, losses, run, wait_for
from tests.loop_helpers import plan_quick

submitit = require("submitit", "slurm")
SLOW = {"task": {"sleep_s": 0.02}, "hold": {"loop.checkpoint_every": 5}, "validation_every": 3}


def _final_weights(ledger: Ledger, campaign: str, run_id: str) -> dict[str, torch.Tensor]:
    artifacts = ledger.artifacts(campaign)
    (path,) = artifacts[(artifacts["run_id"] == run_id) & (artifacts["kind"] == "final")]["path"]
    return dict(load_file(path))


def _submit_and_preempt(
    ledger: Ledger, url: str, campaign: str, run_id: str, tmp_path: Path, max_requeues: int
) -> Any:
    """Submit the run as a job of submitit's local executor and send it SLURM's preemption
    signal in the middle of its run (the local executor's own _interrupt signals its
    controller, not the task)."""
    from campaign.launch.slurm_executor import RunJob

    options = WorkerOptions(campaign, tmp_path / "artifacts", heartbeat_s=0.3, lease_s=5,
                            replay_in_subprocess=False)  # fmt: skip
    executor = submitit.LocalExecutor(folder=str(tmp_path / "jobs"))
    executor.update_parameters(timeout_min=30)
    job = executor.submit(RunJob(max_requeues), url, options_document(options), run_id, str(ROOT))
    wait_for(lambda: last_step(ledger, run_id) >= 7, 120, "update 7 of the job's run")
    os.kill(int(ledger.run(run_id).worker.split(":")[1]), signal.SIGUSR2)
    return job


@pytest.mark.slow
def test_preempted_job_checkpoints_requeues_and_ends_bit_identical(
    sqlite_url: str, tmp_path: Path
) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        (reference,) = plan_quick(ledger, "reference", runs=1, updates=30, **SLOW)
        execute(ledger, reference, artifacts=tmp_path / "reference", replay_in_subprocess=False)
        (run_id,) = plan_quick(ledger, "slurm", runs=1, updates=30, **SLOW)

        job = _submit_and_preempt(ledger, sqlite_url, "slurm", run_id, tmp_path, max_requeues=2)
        result = job.result()

        assert result["status"] == "completed", result
        record = ledger.run(run_id)
        assert (record.status, record.stop_step) == ("completed", 30)
        events = ledger.events("slurm", run_id)
        kinds = list(events["kind"])
        assert kinds[:4] == ["planned", "running", "interrupted", "resumed"]
        interrupted = events[events["kind"] == "interrupted"]["detail"].iloc[0]
        assert "preempted" in interrupted and "SIGUSR2" in interrupted
        segments = ledger.segments("slurm").sort_values("ordinal")
        assert list(segments["ordinal"]) == [1, 2]
        assert int(segments["start_step"].iloc[1]) > 0  # continued from its checkpoint
        # Same weights, bit for bit, as the run that was never interrupted.
        mine = _final_weights(ledger, "slurm", run_id)
        theirs = _final_weights(ledger, "reference", reference)
        assert mine.keys() == theirs.keys() and mine
        for name in mine:
            assert torch.equal(mine[name], theirs[name]), name
        assert losses(ledger, run_id).equals(losses(ledger, reference))


def test_slurm_executor_without_slurm_says_so(sqlite_url: str, tmp_path: Path) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        plan_quick(ledger, "no-slurm", runs=1)
    refused = run(sqlite_url, "launch", "no-slurm", "--executor", "slurm", "--skip-pilot",
                  "--reason", "test", "--artifacts", str(tmp_path))  # fmt: skip
    assert refused.returncode == 2
    assert "no SLURM on this machine" in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.slow
def test_requeue_limit_leaves_the_run_interrupted_and_resumable(
    sqlite_url: str, tmp_path: Path
) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        (run_id,) = plan_quick(ledger, "limited", runs=1, updates=60, **SLOW)
        job = _submit_and_preempt(ledger, sqlite_url, "limited", run_id, tmp_path, max_requeues=0)
        with pytest.raises(Exception, match="not requeued"):
            job.result()
        record = ledger.run(run_id)
        assert (record.status, record.stop_cause) == ("interrupted", "preempted")
        assert len(ledger.segments("limited")) == 1  # no requeue past the limit
