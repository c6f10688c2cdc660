"""A run's ranks on SLURM: a sharded run of 2 ranks launched as an array task of 2 SLURM tasks,
rank 0 in the worker's step and rank 1 a step of its own; the scheduler's preemption warning
to the array task reaches both, the whole run checkpoints, is requeued and resumes, and its
series equals the same run's on local ranks."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd
import pytest

from campaign.ledger import Ledger
from tests.launch.test_slurm_cluster import (  # noqa: F401 (cluster: the fixture)
    _launch,
    _release_requeued,
    _slurm_job_of,
    _tasks,
    cluster,
)
from tests.support.engine_helpers import checkpoint_steps, running_past
from tests.support.launch_helpers import losses, run, wait_for
from tests.support.loop_helpers import plan_quick

pytestmark = pytest.mark.engine

SHARDED = {"loop.replicas": 2, "loop.strategy": "fsdp", "loop.accumulation": 1,
           "loop.checkpoint_every": 5}


@pytest.mark.slow
def test_a_sharded_runs_ranks_are_slurm_tasks_and_a_preemption_checkpoints_them_all(
    postgresql_url: str, tmp_path: Path, cluster: list[str]
) -> None:
    cluster.append("sl-ranks")
    with Ledger.open(postgresql_url, create=True) as ledger:
        (reference,) = plan_quick(ledger, "sl-ranks-local", runs=1, updates=40,
                                  task={"sleep_s": 0.03}, hold=SHARDED, validation_every=10)
        (run_id,) = plan_quick(ledger, "sl-ranks", runs=1, updates=40,
                               task={"sleep_s": 0.03}, hold=SHARDED, validation_every=10)
    local = run(postgresql_url, "worker", "sl-ranks-local", "--artifacts", str(tmp_path / "l"),
                "--skip-pilot", "--reason", "reference", "--no-replay-check")
    assert local.returncode == 0, local.stderr[-2000:]
    launch = _launch(postgresql_url, "sl-ranks", tmp_path / "art", "--workers", "1")
    with Ledger.open(postgresql_url) as ledger:
        found: list[tuple[str, str]] = []
        wait_for(lambda: bool(found.extend(running_past(ledger, "sl-ranks", 7)) or found),
                 240, "the sharded run past update 7 in its array task")
        script = next((tmp_path / "art" / "slurm").glob("*.sbatch")).read_text()
        assert "#SBATCH --ntasks=2" in script
        subprocess.run(["scancel", "--signal=USR2", _slurm_job_of(found[0][1])], check=True)
        wait_for(lambda: ledger.run(run_id).status != "running", 120, "the preempted run's end")
        record = ledger.run(run_id)
        assert (record.status, record.stop_cause) == ("interrupted", "preempted"), (
            record.stop_detail)
        assert record.stop_step in checkpoint_steps(ledger, "sl-ranks", run_id)
        wait_for(lambda: _release_requeued("sl-ranks") or launch.poll() is not None, 400,
                 "the launcher's end", every=2)
        _, stderr = launch.communicate(timeout=60)
        assert launch.returncode == 0, stderr[-3000:]
        assert ledger.run(run_id).status == "completed"
        assert len(ledger.segments("sl-ranks")) == 2
        pd.testing.assert_series_equal(losses(ledger, run_id), losses(ledger, reference),
                                       check_exact=False, rtol=1e-9, atol=0)
        logs = ledger.artifacts("sl-ranks").query("kind == 'log'")["path"]
        text = "".join(Path(p).read_text() for p in logs)
        assert text.count(f"run {run_id}: ranks 1..1 as a SLURM step of job") == 2, text[-2000:]
        checkpoint = Path(ledger.artifacts("sl-ranks").query("kind == 'checkpoint'")
                          .sort_values("step")["path"].iloc[-1])
        assert checkpoint.with_name(checkpoint.stem + ".rank-1.safetensors").is_file()
