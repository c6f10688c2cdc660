"""The SLURM executor through submitit: a job array, one job per run, requeued on preemption.

SLURM announces preemption and the end of a job's time limit with a signal
(submitit asks for USR2 ahead of the limit). The run's loop treats that
signal as a stop request: it finishes the current update, writes a
checkpoint, and ends ``interrupted`` with stop cause ``preempted``. Then
submitit's own handler requeues the job (``scontrol requeue``; the local
simulator reruns it), and the requeued job continues the run from that
checkpoint in a new segment. ``--max-requeues`` bounds how often one run may
be requeued: past it, the run stays ``interrupted`` (resumable by hand) and
the job ends.

What submitit pickles to ship a job is this module's task object and plain
values (ledger URL, options as a dict, run id): no tensors, no results.
Checkpoints stay safetensors + JSON.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from campaign.launch.live_table import ProgressDisplay, Snapshot, take_snapshot
from campaign.launch.placement import (
    PlacementError,
    options_document,
    outcome_document,
    run_placed,
)
from campaign.launch.worker import WorkerOptions
from campaign.ledger import Ledger

PREEMPT_SIGNAL = signal.SIGUSR2


@dataclass(frozen=True)
class SlurmOptions:
    folder: Path
    partition: str | None = None
    time_min: int = 60
    max_requeues: int = 3
    gpus_per_run: int = 0
    parallel: int | None = None  # array parallelism
    local: bool = False  # submitit's local executor: simulate SLURM on this machine


def _import_submitit() -> Any:
    try:
        import submitit
    except ImportError:
        raise PlacementError(
            "--executor slurm needs submitit: pip install 'campaign[slurm]'"
        ) from None
    return submitit


class RunJob:
    """One job of the array: execute one run; on preemption, checkpoint and ask to be requeued.

    submitit calls :meth:`checkpoint` from its signal handler to get the job
    to requeue; by then the run has already ended ``interrupted`` (see
    :meth:`__call__`), so requeueing the same arguments resumes it.
    """

    def __init__(self, max_requeues: int) -> None:
        self.max_requeues = max_requeues

    def __call__(self, url: str, options: dict[str, Any], run_id: str, cwd: str) -> dict[str, Any]:
        submitit_handler = signal.getsignal(PREEMPT_SIGNAL)
        outcome = run_placed(url, options, run_id, cwd, preempt_signals=(int(PREEMPT_SIGNAL),))
        if outcome is not None and outcome.cause == "preempted" and callable(submitit_handler):
            # The run is checkpointed and interrupted: let submitit requeue this job now.
            submitit_handler(int(PREEMPT_SIGNAL), None)
        return outcome_document(run_id, outcome)

    def checkpoint(self, url: str, options: dict[str, Any], run_id: str, cwd: str) -> Any:
        """The job to requeue (the same run), or None once the run used up its requeues."""
        submitit = _import_submitit()
        with Ledger.open(url) as ledger:
            events = ledger.events(options["campaign"], run_id)
        preempted = int(events["detail"].str.contains("preempted", regex=False).sum())
        if preempted > self.max_requeues:
            return None
        return submitit.helpers.DelayedSubmission(self, url, options, run_id, cwd)


def launch_on_slurm(
    url: str, options: WorkerOptions, slurm: SlurmOptions, display: ProgressDisplay
) -> Snapshot:
    """Submit a job array (one job per run) and follow the campaign in the ledger."""
    submitit = _import_submitit()
    if slurm.local:
        executor: Any = submitit.LocalExecutor(folder=str(slurm.folder))
        executor.update_parameters(timeout_min=slurm.time_min)
    else:
        if shutil.which("sbatch") is None:
            raise PlacementError("--executor slurm: no SLURM on this machine (sbatch not found)")
        executor = submitit.AutoExecutor(folder=str(slurm.folder), cluster="slurm")
        executor.update_parameters(
            timeout_min=slurm.time_min, slurm_partition=slurm.partition,
            gpus_per_node=slurm.gpus_per_run or None, cpus_per_task=max(1, options.threads or 1),
            slurm_array_parallelism=slurm.parallel or 64, slurm_signal_delay_s=120,
            slurm_max_num_timeout=slurm.max_requeues,
        )  # fmt: skip
    with Ledger.open(url) as ledger:
        statuses = ["planned", *options.resume]
        run_ids = [str(r) for r in ledger.runs(options.campaign, status=statuses)["run_id"]]
        payload = options_document(options)
        task = RunJob(slurm.max_requeues)
        jobs = executor.map_array(
            task, [url] * len(run_ids), [payload] * len(run_ids), run_ids,
            [os.getcwd()] * len(run_ids),
        )  # fmt: skip
        while not all(job.done() for job in jobs):
            ledger.mark_lost(options.lease_s, options.campaign)
            display.show(take_snapshot(ledger, options.campaign))
            time.sleep(1.0)
        snapshot = take_snapshot(ledger, options.campaign)
        display.show(snapshot)
        display.close()
    for job in jobs:
        if job.state not in ("COMPLETED", "FINISHED") and job.exception() is not None:
            lines = str(job.exception()).strip().splitlines()
            print(f"campaign: SLURM job {job.job_id} failed: {lines[-1] if lines else ''}",
                  file=sys.stderr)  # fmt: skip
    return snapshot
