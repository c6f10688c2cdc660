"""The SLURM executor: one job array of ``campaign worker`` tasks, submitted with ``sbatch``.

Each array task is a worker with one task host (:mod:`campaign.launch.slurm_task`):
it claims runs from the ledger until none is left, so the gap between two
runs on one slot is a local worker's (tens of milliseconds), not a new job.
The launcher writes a batch script into a 0700 folder, submits it, and then
follows the ledger and ``squeue`` together; it ends when no task of the
array is queued or running and no run of the campaign is ``running`` (a run
whose task died with its node is declared ``lost`` once its lease expires,
so the launcher never waits for ever, with or without SLURM accounting).

The ledger URL reaches the tasks only through the job's environment
(``CAMPAIGN_LEDGER``, exported by ``sbatch``), never through the script, a
command line or a file on the shared disk.

SIGINT/SIGTERM to the launcher: tasks still queued are cancelled, running
tasks get SIGTERM (their runs checkpoint and end ``interrupted``), and once
no run is ``running`` (or after the grace) the job is cancelled.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from campaign.launch.live_table import ProgressDisplay, Snapshot, take_snapshot
from campaign.launch.placement import PlacementError
from campaign.launch.worker import WorkerOptions
from campaign.launch.worker_command import worker_command
from campaign.ledger import Ledger
from campaign.ledger.location import ENV_VAR

PREEMPT_SIGNAL = "USR2"
POLL_S = 2.0


@dataclass(frozen=True)
class SlurmOptions:
    folder: Path
    workers: int = 1  # array tasks
    partition: str | None = None
    time_min: int = 60
    max_requeues: int = 3
    gpus_per_task: int = 0
    cpus_per_task: int = 1
    signal_s: int = 120  # the preemption warning, this long before the time limit
    grace_s: float = 300.0


def batch_script(options: WorkerOptions, slurm: SlurmOptions, cwd: str) -> str:
    """The batch script of the array: one ``campaign worker`` step per task."""
    name = f"campaign:{options.campaign}"
    lines = [
        "#!/bin/bash",
        f"# Written by `campaign launch --executor slurm` for {options.campaign!r}: "
        f"{slurm.workers} worker(s).",
        f"#SBATCH --job-name={shlex.quote(name)}",
        f"#SBATCH --array=0-{slurm.workers - 1}",
        f"#SBATCH --time={slurm.time_min}",
        f"#SBATCH --signal={PREEMPT_SIGNAL}@{slurm.signal_s}",
        "#SBATCH --requeue",
        "#SBATCH --ntasks=1",
        f"#SBATCH --cpus-per-task={slurm.cpus_per_task}",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={shlex.quote(str(slurm.folder / '%A_%a.log'))}",
    ]
    if slurm.partition:
        lines.append(f"#SBATCH --partition={shlex.quote(slurm.partition)}")
    if slurm.gpus_per_task:
        lines.append(f"#SBATCH --gres=gpu:{slurm.gpus_per_task}")
    device = "cuda" if slurm.gpus_per_task else "cpu"
    command = worker_command(options, device, slurm.cpus_per_task, "--slurm",
                             "--max-requeues", str(slurm.max_requeues))  # fmt: skip
    lines += [
        f"cd {shlex.quote(cwd)} || exit 1",
        # A step, so that SLURM's signals (scancel, the time-limit warning) reach the worker,
        # its task host and its run's process, as on any cluster.
        "exec srun --ntasks=1 --unbuffered " + shlex.join(command),
        "",
    ]
    return "\n".join(lines)


def private_folder(folder: Path) -> Path:
    """The job folder, readable by its owner only (0700): logs may name paths and runs."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise PlacementError(f"--executor slurm: no SLURM on this machine ({name} not found)")
    return found


def submit(url: str, options: WorkerOptions, slurm: SlurmOptions) -> str:
    """Write the batch script and submit it; the array's job id."""
    sbatch = _tool("sbatch")
    folder = private_folder(slurm.folder)
    script = folder / f"{options.campaign}.sbatch"
    script.write_text(batch_script(options, slurm, os.getcwd()))
    script.chmod(0o600)
    env = {**os.environ, ENV_VAR: url}  # exported to the job by sbatch (--export=ALL)
    done = subprocess.run([sbatch, "--parsable", str(script)], env=env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    if done.returncode != 0:
        raise PlacementError(f"sbatch refused the job array: {done.stderr.strip()}")
    return done.stdout.strip().split(";")[0]


def live_tasks(job_id: str) -> dict[str, tuple[str, str]]:
    """Tasks of the array that SLURM still queues or runs: ``{task: (state, reason)}``.

    squeue forgets a job some minutes after it ended (MinJobAge): an absent task has
    ended, which is all the launcher needs (no accounting database required)."""
    done = subprocess.run([_tool("squeue"), "-h", "-r", "-j", job_id, "-o", "%i|%T|%r"],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:
            return {}
        raise PlacementError(f"squeue -j {job_id}: {done.stderr.strip()}")
    tasks = {}
    for line in done.stdout.splitlines():
        task, state, reason = ([*line.split("|"), "", ""])[:3]
        if state not in ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY",
                         "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "PREEMPTED"):  # fmt: skip
            tasks[task] = (state, reason)
    return tasks


def scancel(job_id: str, *arguments: str) -> None:
    subprocess.run([_tool("scancel"), *arguments, job_id], capture_output=True, timeout=60,
                   check=False)  # fmt: skip


def launch_on_slurm(
    url: str, options: WorkerOptions, slurm: SlurmOptions, display: ProgressDisplay
) -> tuple[Snapshot, bool]:
    """Submit the array and follow it to the end; (the last snapshot, interrupted)."""
    job_id = submit(url, options, slurm)
    print(f"campaign: submitted SLURM job array {job_id} ({slurm.workers} worker(s)); "
          f"logs in {slurm.folder}", file=sys.stderr)  # fmt: skip
    stopping = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stopping.set())
                for s in (signal.SIGTERM, signal.SIGINT)}  # fmt: skip
    try:
        with Ledger.open(url) as ledger:
            snapshot = _follow(ledger, job_id, options, slurm, display, stopping)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    display.show(snapshot)
    display.close()
    _say_failed_tasks(slurm.folder, job_id)
    return snapshot, stopping.is_set()


def _follow(ledger: Ledger, job_id: str, options: WorkerOptions, slurm: SlurmOptions,
            display: ProgressDisplay, stopping: threading.Event) -> Snapshot:  # fmt: skip
    stopped_at: float | None = None
    while True:
        ledger.mark_lost(options.lease_s, options.campaign)
        snapshot = take_snapshot(ledger, options.campaign, slurm.workers)
        display.show(snapshot)
        tasks = live_tasks(job_id)
        if not tasks and not snapshot.running:
            return snapshot
        if stopping.is_set():
            if stopped_at is None:  # queued tasks never start; running ones checkpoint
                stopped_at = time.monotonic()
                scancel(job_id, "--state=PENDING")
                scancel(job_id, "--signal=TERM")
            elif not snapshot.running or time.monotonic() - stopped_at > slurm.grace_s:
                scancel(job_id)
                if not tasks:
                    return snapshot
        time.sleep(POLL_S)


def _say_failed_tasks(folder: Path, job_id: str) -> None:
    """A task whose worker ended in an error says so in its log's last lines: name it."""
    for log in sorted(folder.glob(f"{job_id}_*.log")):
        lines = [line for line in _tail(log) if line.startswith(("campaign:", "Traceback"))]
        errors = [line for line in lines if "error" in line.lower() or "Traceback" in line]
        if errors:
            task = log.stem
            print(f"campaign: SLURM task {task}: {errors[-1]} (log: {log})", file=sys.stderr)


def _tail(path: Path, size: int = 8192) -> list[str]:
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - size))
        return handle.read().decode(errors="replace").splitlines()
