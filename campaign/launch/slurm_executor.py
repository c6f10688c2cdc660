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
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from campaign.launch.live_table import ProgressDisplay
from campaign.launch.placement import PlacementError, settle
from campaign.launch.slurm_task import work_for_a_requeued_task
from campaign.launch.worker import WorkerOptions
from campaign.launch.worker_command import worker_command
from campaign.ledger import Ledger
from campaign.ledger.location import ENV_VAR
from campaign.ledger.progress import Snapshot, take_snapshot
from campaign.stack.devices import SLURM_TASKS

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
    # Tasks per array task: the campaign's largest loop.replicas. A run of W ranks takes W
    # of them, its ranks 1..W-1 a step of their own (campaign/launch/replicated.py), on
    # whichever nodes SLURM gives the allocation.
    ranks: int = 1

    def __post_init__(self) -> None:
        # A value goes into one #SBATCH line: a newline in it would add a line of its own.
        if self.partition is not None and not re.fullmatch(r"[A-Za-z0-9_.,+-]+", self.partition):
            raise PlacementError(f"--slurm-partition {self.partition!r}: not a SLURM partition "
                                 "name (letters, digits, '_', '.', '-', '+'; several with ',')")
        if any(ord(c) < 32 or ord(c) == 127 for c in str(self.folder)):
            raise PlacementError(f"the SLURM job folder {str(self.folder)!r} holds a control "
                                 "character (a newline would add a line to the batch script)")


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
        f"#SBATCH --ntasks={slurm.ranks}",
        f"#SBATCH --cpus-per-task={slurm.cpus_per_task}",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={shlex.quote(str(slurm.folder / '%A_%a.log'))}",
    ]
    if slurm.partition:
        lines.append(f"#SBATCH --partition={shlex.quote(slurm.partition)}")
    if slurm.gpus_per_task:  # each rank its own device(s), wherever SLURM places it
        per_rank = -(-slurm.gpus_per_task // slurm.ranks)  # --gpus-per-run over its ranks
        lines.append(f"#SBATCH --gpus-per-task={per_rank}" if slurm.ranks > 1
                     else f"#SBATCH --gres=gpu:{slurm.gpus_per_task}")
    device = "cuda" if slurm.gpus_per_task else "cpu"
    command = worker_command(options, device, slurm.cpus_per_task, "--slurm",
                             "--max-requeues", str(slurm.max_requeues))
    lines += [
        f"cd {shlex.quote(cwd)} || exit 1",
        f"export {SLURM_TASKS}={slurm.ranks}  # a run's other ranks: a step of its own",
        # A step, so that SLURM's signals (scancel, the time-limit warning) reach the worker,
        # its task host and its run's process, as on any cluster.
        # --exact: the worker's step (with a run's rank 0) holds one task's CPUs, leaving the
        # allocation's others to its run's other ranks (a step of their own)
        "exec srun --ntasks=1 " + ("--exact " if slurm.ranks > 1 else "") + "--unbuffered "
        + shlex.join(command),
        "",
    ]
    return "\n".join(lines)


def private_folder(folder: Path) -> Path:
    """The job folder: created readable by its owner only (0700), since logs name paths and
    runs; a folder the user already has keeps its mode (it may be a team's)."""
    if not folder.exists():
        folder.mkdir(parents=True, mode=0o700)
        folder.chmod(0o700)
    return folder


def write_private(path: Path, text: str) -> Path:
    """``text`` as ``path``, written as a new private file (O_EXCL, 0600) and renamed over the
    name: a link planted there in a shared folder is replaced, never followed (its target was
    overwritten and made 0600 before)."""
    try:
        handle, fresh = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as error:
        raise PlacementError(f"cannot write the batch script in {path.parent}: "
                             f"{error.strerror or error}") from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(fresh, path)
    except BaseException as error:
        Path(fresh).unlink(missing_ok=True)
        if isinstance(error, OSError):  # (another's file in a sticky folder, a folder there)
            raise PlacementError(f"cannot write the batch script {path}: "
                                 f"{error.strerror or error}") from None
        raise
    return path


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise PlacementError(f"--executor slurm: no SLURM on this machine ({name} not found)")
    return found


def _call(name: str, *arguments: str, env: dict[str, str] | None = None,
          tries: int = 1) -> subprocess.CompletedProcess[str]:
    """One of SLURM's commands, its result as it answered; asked up to ``tries`` times while
    it fails (a controller that restarts answers again). One that cannot run at all is a
    :class:`PlacementError`."""
    attempt = 1
    while True:
        try:
            done = subprocess.run([_tool(name), *arguments], env=env, capture_output=True,
                                  text=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            if attempt >= tries:
                raise PlacementError(f"{name} {' '.join(arguments)}: {error}") from None
        else:
            if done.returncode == 0 or attempt >= tries:
                return done
        time.sleep(2.0 * attempt)
        attempt += 1


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def submit(url: str, options: WorkerOptions, slurm: SlurmOptions) -> str:
    """Write the batch script and submit it; the array's job id."""
    folder = private_folder(slurm.folder)
    script = write_private(folder / f"{options.campaign}.sbatch",
                           batch_script(options, slurm, os.getcwd()))
    # The job's environment is the launcher's, the ledger URL in it (--export=ALL overrides a
    # site's SBATCH_EXPORT=NONE, which would leave the job without it).
    env = {**os.environ, ENV_VAR: url}
    done = _call("sbatch", "--parsable", "--export=ALL", str(script), env=env)
    if done.returncode != 0:
        raise PlacementError(f"sbatch refused the job array: {_one_line(done.stderr)}")
    return done.stdout.strip().split(";")[0]


ENDED = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
         "BOOT_FAIL", "DEADLINE", "PREEMPTED")


def live_tasks(job_id: str) -> dict[str, str]:
    """Tasks of the array that SLURM still queues or runs: ``{task: state}``.

    squeue forgets a job some minutes after it ended (MinJobAge): an absent task has
    ended, which is all the launcher needs (no accounting database required). A task
    ``COMPLETING`` is listed: it has no worker left, but it may be on its way back to the
    queue (a requeue passes through COMPLETING), which :func:`_follow` tells apart."""
    done = _call("squeue", "-h", "-r", "-j", job_id, "-o", "%i|%T", tries=3)
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:
            return {}
        raise PlacementError(f"squeue -j {job_id}: {_one_line(done.stderr)}; the job array "
                             f"may still run: campaign status, scancel {job_id}")
    tasks = {}
    for line in done.stdout.splitlines():
        task, _, state = line.partition("|")
        if state not in ENDED:
            tasks[task] = state
    return tasks


def scancel(job_id: str, *arguments: str) -> None:
    _call("scancel", *arguments, job_id)


def launch_on_slurm(
    url: str, options: WorkerOptions, slurm: SlurmOptions, display: ProgressDisplay
) -> tuple[Snapshot, bool]:
    """Submit the array and follow it to the end; (the last snapshot, interrupted)."""
    job_id = submit(url, options, slurm)
    print(f"campaign: submitted SLURM job array {job_id} ({slurm.workers} worker(s)); "
          f"logs in {slurm.folder}", file=sys.stderr)
    signals: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _: signals.append(signum))
                for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with Ledger.open(url, ride_out=True) as ledger:  # follows through an outage
            _follow(ledger, job_id, options, slurm, display, signals)
            snapshot = settle(ledger, options, display)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    display.show(snapshot)
    display.close()
    _say_failed_tasks(slurm.folder, job_id)
    return snapshot, bool(signals)


def _follow(ledger: Ledger, job_id: str, options: WorkerOptions, slurm: SlurmOptions,
            display: ProgressDisplay, signals: list[int]) -> None:
    """Until no task of the array is queued or running (and, after a stop, the grace)."""
    stopped_at: float | None = None
    while True:
        ledger.mark_lost(options.lease_s, options.campaign)
        snapshot = take_snapshot(ledger, options.campaign, slurm.workers)
        display.show(snapshot)
        tasks = live_tasks(job_id)
        if not tasks or (set(tasks.values()) == {"COMPLETING"}
                         and not work_for_a_requeued_task(ledger, options.campaign)):
            return  # (a task ending with work left may be requeued: seen again as PENDING)
        if signals:
            if stopped_at is None:  # queued tasks never start; running ones checkpoint
                stopped_at = time.monotonic()
                scancel(job_id, "--state=PENDING")
                scancel(job_id, "--signal=TERM")
            elif len(signals) > 1:  # asked twice: stop waiting, say what is left
                scancel(job_id)
                raise PlacementError(f"stopped waiting for SLURM job {job_id}: cancelled; "
                                     "its runs end as its tasks are killed")
            elif not snapshot.running or time.monotonic() - stopped_at > slurm.grace_s:
                scancel(job_id)
        time.sleep(POLL_S)


def _say_failed_tasks(folder: Path, job_id: str) -> None:
    """One line for each task that did not simply finish: how it ended, from its log."""
    for log in sorted(folder.glob(f"{job_id}_*.log")):
        said = task_ending([line.strip() for line in _tail(log) if line.strip()])
        if said is not None:
            print(f"campaign: SLURM task {log.stem}: {said} (log: {log})", file=sys.stderr)


def task_ending(lines: list[str]) -> str | None:
    """How an array task ended, in words, from the last lines of its log (srun's and
    slurmstepd's own lines, the worker's last): None when it finished normally. A stop by a
    signal is no error (its runs checkpointed); a task killed outright is named as such."""
    text = "\n".join(lines)
    if re.search(r"task \d+: Killed|oom[-_ ]kill|OUT_OF_MEMORY", text, re.IGNORECASE):
        return ("killed by SIGKILL (the kernel's OOM killer, an operator, a lost node): its run "
                "is declared lost once its lease runs out, then resumed (--resume-lost)")
    limit = re.search(r"CANCELLED AT \S+ DUE TO (TIME LIMIT|PREEMPTION)", text)
    if limit:
        return f"stopped by SLURM ({limit.group(1).lower()}); its run checkpointed"
    stopped = re.search(r"stopped by (SIG\w+)", text)  # the worker's own last word
    if stopped or "CANCELLED" in text or re.search(r"task \d+: Terminated", text):
        name = stopped.group(1) if stopped else "SIGTERM"
        why = ("a preemption or the time-limit warning" if name == "SIGUSR2"
               else "scancel, or the launcher's stop")
        return f"stopped by {name} ({why}); its run checkpointed"
    errors = [line for line in lines if "error" in line.lower() and "srun: error" not in line]
    last = lines[-1] if lines else ""
    if errors or "error" in last.lower():  # the worker's own error line, else srun's
        return (errors or [last])[-1]
    return None


def _tail(path: Path, size: int = 8192) -> list[str]:
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - size))
        return handle.read().decode(errors="replace").splitlines()
