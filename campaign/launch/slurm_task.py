"""What a worker does differently when it is a task of a SLURM job array.

SLURM signals every process of a job step at once. ``scancel`` sends SIGTERM
(then SIGKILL after the cluster's ``KillWait``); a preemption, and the
warning the batch script asks for ahead of the time limit
(``--signal=USR2@SECONDS``), send SIGUSR2. Only the supervisor interprets
them (:mod:`campaign.launch.supervisor`): SIGTERM ends the run
``interrupted``/``interrupted``, SIGUSR2 ``interrupted``/``preempted``, each
with a checkpoint at the update it was in.

After a preemption the task requeues itself (``scontrol requeue``): the
allocation is about to go, the campaign is not done. The requeued task is a
fresh worker that, like every array task, resumes preempted runs before it
claims planned ones, so the preempted run continues wherever a slot is free.
``max_requeues`` bounds how often one array task is requeued (SLURM counts
them in ``SLURM_RESTART_COUNT``); past it the run stays ``interrupted``,
resumable by ``launch --resume-interrupted``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ArrayTask:
    """This process's place in a SLURM job array, read from the variables SLURM sets."""

    job_id: str  # the task's own job id (SLURM_JOB_ID: the array's own id for one task)
    array_job_id: str | None
    array_task_id: str | None
    restarts: int

    @property
    def name(self) -> str:
        """``ARRAYJOB_TASK`` as squeue shows it (or the plain job id)."""
        if self.array_job_id and self.array_task_id:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id


def this_task(environment: Mapping[str, str] | None = None) -> ArrayTask | None:
    """The array task this process runs in, or None outside a SLURM job."""
    env = os.environ if environment is None else environment
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        return None
    return ArrayTask(job_id, env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID"),
                     int(env.get("SLURM_RESTART_COUNT") or 0))


class RequeueRefused(RuntimeError):
    """``scontrol requeue`` failed (the cluster may forbid requeueing: JobRequeue=0)."""


def requeue(task: ArrayTask) -> None:
    """Put this array task back in the queue after a preemption (the caller has checked
    ``task.restarts`` against ``max_requeues``).

    Called after the run ended and its checkpoint is recorded: SLURM ends this
    job's processes as it requeues it.
    """
    scontrol = shutil.which("scontrol") or "scontrol"
    # By ARRAYJOB_TASK, never SLURM_JOB_ID: one task's job id is the array's own, and
    # requeueing it requeued every task of the array, killing the runs of the others.
    done = subprocess.run([scontrol, "requeue", task.name], capture_output=True, text=True,
                          timeout=60, check=False)
    if done.returncode != 0:
        raise RequeueRefused(f"scontrol requeue {task.name}: {done.stderr.strip()}")


def work_for_a_requeued_task(ledger: Any, campaign: str) -> bool:
    """Planned runs, or runs a preemption, a kill or an outage interrupted: a requeued task
    would have work (it resumes those first). The task asks before it requeues itself; the
    launcher asks before it takes a task that SLURM is ending for gone (a requeue passes
    through COMPLETING on its way back to PENDING)."""
    runs = ledger.runs(campaign, status=["planned", "interrupted"])
    resumable = runs["stop_cause"].isin(("preempted", "killed", "ledger_unreachable"))
    return bool(((runs["status"] == "planned") | resumable).any())
