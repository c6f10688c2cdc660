"""What the SLURM launcher says of each array task, from the last lines of its log: srun's and
slurmstepd's own words (as SLURM 22.05 writes them, captured from the test cluster) and the
worker's. A stop by a signal is no error; a task killed outright is named; one that finished
says nothing."""

from __future__ import annotations

import pytest

from campaign.launch.slurm_executor import task_ending

CANCELLED = ["slurmstepd-vm: error: *** STEP 3.0 ON vm CANCELLED AT 2026-12-05T07:31:49 ***",
             "srun: error: vm: task 0: Terminated", "srun: Force Terminated StepId=3.0"]
KILLED = ["srun: error: vm: task 0: Killed", "srun: Force Terminated StepId=2.0"]
SIGNALLED = ["campaign: worker cpu:4242@vm stopped by SIGTERM",
             "srun: error: vm: task 0: Exited with exit code 1"]
PREEMPTED = ["campaign: worker cpu:4242@vm stopped by SIGUSR2",
             "srun: error: vm: task 0: Exited with exit code 1"]
TIME_LIMIT = ["slurmstepd-vm: error: *** JOB 9 ON vm CANCELLED AT 2026-12-05T08:00:00 DUE TO "
              "TIME LIMIT ***"]
FAILED = ["campaign: ledger error: ledger postgresql://u@db/lab unreachable while claiming",
          "srun: error: vm: task 0: Exited with exit code 3"]


@pytest.mark.parametrize(("lines", "said"), [
    (CANCELLED, "stopped by SIGTERM (scancel, or the launcher's stop); its run checkpointed"),
    (SIGNALLED, "stopped by SIGTERM (scancel, or the launcher's stop); its run checkpointed"),
    (PREEMPTED, "stopped by SIGUSR2 (a preemption or the time-limit warning); its run "
                "checkpointed"),
    (TIME_LIMIT, "stopped by SLURM (time limit); its run checkpointed"),
    (FAILED, "campaign: ledger error: ledger postgresql://u@db/lab unreachable while claiming"),
    ([], None),
    (["run 01abc: completed (budget_reached) at update 30"], None),
])
def test_each_way_a_task_ends_is_said_in_one_line(lines: list[str], said: str | None) -> None:
    assert task_ending(lines) == said


def test_a_killed_task_is_named_with_what_becomes_of_its_run() -> None:
    said = task_ending(KILLED)
    assert said is not None and said.startswith("killed by SIGKILL") and "--resume-lost" in said
