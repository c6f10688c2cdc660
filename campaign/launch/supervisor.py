"""The supervisor: a run executes in a forked child, and its worker makes sure it ends.

Why a child process: task code is a user's, and it can hang in ``loss()``,
call ``sys.exit``, ``os._exit``, segfault, fork, or print. A thread that
stamps the heartbeat regardless kept such runs ``running`` for ever. Here
the parent (a worker, or ``campaign run``) holds the lease and the
heartbeat, and stamps only while the child's progress page
(:mod:`campaign.loop.progress`) moves. It enforces, on the run's behalf:

- the wall time as a hard limit: SIGUSR1 at the limit (the loop ends
  ``stopped``/``wall_time`` after its update), SIGKILL ``grace_s`` later;
- the stall limit (``stop.stall``, default 10 minutes without a tick):
  the child's process group is killed and the run ends ``failed``/``stalled``
  with the phase and update it was stuck in;
- SIGTERM/SIGINT to the parent: forwarded, then a kill after the grace
  (the run ends ``interrupted``, resumable);
- a child that exits, is killed or segfaults without recording its end:
  ``failed``/``exception`` with its exit status or signal.

The child is forked from a fork server that imported torch and never
initialised CUDA (no fresh interpreter per run: a run starts in milliseconds;
no fork of a process whose threads or OpenMP pool could hold a lock), in its
own process group (so a task's forked orphans die with it), with stdin from
``/dev/null`` and stdout/stderr captured into the run's ``log`` artifact: a
command's JSON output stays clean. It follows its supervisor: it dies when
the supervisor dies and stops while the supervisor is stopped.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import io
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

from sqlalchemy.exc import SQLAlchemyError

from campaign.ledger import Claim, Ledger, LedgerError, RefusedWrite, StopRecord
from campaign.ledger.errors import LeaseLost
from campaign.loop import progress
from campaign.loop.forkserver import fork_context, start
from campaign.loop.run_files import record_file
from campaign.loop.signals import WALL_TIME_SIGNAL
from campaign.loop.stop import parse_duration
from campaign.loop.train import RunOutcome

DEFAULT_STALL_S = 600.0
CHILD_FAILED = 70  # the child's exit code when its body raised (EX_SOFTWARE)
PR_SET_PDEATHSIG = 1
SUPERVISOR_ENV = "CAMPAIGN_SUPERVISOR_PID"  # in the run's process: its supervisor's id


@dataclass(frozen=True)
class Supervision:
    """How a run is watched: ``grace_s`` between a graceful signal and the kill."""

    heartbeat_s: float
    grace_s: float = 30.0
    poll_s: float = 0.05
    fork_directly: bool = False  # see campaign.loop.forkserver.fork_context


@dataclass
class _Verdict:
    """What the parent records when the child does not record its own end."""

    status: str
    cause: str
    detail: str


@dataclass(frozen=True)
class ChildJob:
    """What the run's process needs, sent to it through the fork server (never on argv):
    the ledger's URL with its password, the run, and where to write."""

    url: str
    run: Callable[[Ledger, Path], RunOutcome]
    log: Path
    board: Path
    result: Path
    cwd: str
    environment: dict[str, str]


def supervise(
    ledger: Ledger,
    claim: Claim,
    body: Callable[[Ledger, Path], RunOutcome],
    supervision: Supervision,
    *,
    folder: Path,
    config: Mapping[str, Any],
    stopping: threading.Event | None = None,
) -> RunOutcome:
    """Run ``body(ledger, log_path)`` in a child process and return the run's outcome, whatever
    the child does. ``body`` must be picklable (a module-level function or a partial of one):
    it travels to the fork server. Raises :class:`LeaseLost` when the run was taken away."""
    logs = folder.absolute() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stem = f"segment-{claim.ordinal}"
    job = ChildJob(ledger.engine.url.render_as_string(hide_password=False), body,
                   logs / f"{stem}.log", logs / f".{stem}.progress", logs / f".{stem}.json",
                   os.getcwd(), {**os.environ, SUPERVISOR_ENV: str(os.getpid())})  # fmt: skip
    job.result.unlink(missing_ok=True)
    board = progress.ProgressBoard(job.board, create=True)
    context = fork_context(direct=supervision.fork_directly)
    child = context.Process(target=_child, args=(job,), name=f"run-{claim.run_id}")
    start(child)
    try:
        with _forwarding() as received:
            verdict = _watch(ledger, claim, child, board, supervision, config, received, stopping)
    finally:
        _kill_group(child)
        child.join()
        seen = board.read()
        board.close()
        job.board.unlink(missing_ok=True)
    answer = _read_result(job.result)
    if "lease_lost" in answer:
        raise LeaseLost(answer["lease_lost"])
    row = ledger.run(claim.run_id)
    if row.status != "running":  # the child recorded its end
        if "outcome" in answer:
            return RunOutcome(**answer["outcome"])
        return RunOutcome(row.id, row.status, str(row.stop_cause), int(row.stop_step or 0),
                          str(row.stop_detail or ""))  # fmt: skip
    verdict = verdict or _died(child.exitcode, answer, seen)
    stop = StopRecord(verdict.cause, seen.step, seen.phase, verdict.detail)
    with contextlib.suppress(OSError, LedgerError, SQLAlchemyError):
        if job.log.exists():  # before the end: an ended run takes no more rows
            record_file(ledger, claim.run_id, "log", job.log, seen.step, lease=claim.lease)
    ledger.finish(claim.run_id, verdict.status, stop, lease=claim.lease)
    return RunOutcome(claim.run_id, verdict.status, verdict.cause, seen.step, verdict.detail)


def _watch(
    ledger: Ledger,
    claim: Claim,
    child: Any,
    board: progress.ProgressBoard,
    supervision: Supervision,
    config: Mapping[str, Any],
    received: list[int],
    stopping: threading.Event | None,
) -> _Verdict | None:
    """Poll the child until it exits; kill it when a limit says so. Returns the end the parent
    must record if the child did not (None: it died on its own)."""
    stop = config.get("stop", {})
    wall_s = parse_duration(stop.get("wall_time"))
    stall_s = parse_duration(stop.get("stall")) or DEFAULT_STALL_S
    started = last_progress = next_beat = time.monotonic()
    last_ticks, kill_at, verdict = -1, None, None
    wall_signalled = forwarded = False
    pid = child.pid
    polled = time.monotonic()
    while True:
        if child.exitcode is not None:
            return verdict
        now = time.monotonic()
        if now - polled > 1.0:  # this process was stopped, and the run with it: continue it
            _signal(pid, signal.SIGCONT)
            last_progress = now  # a pause of the whole worker is no stall of the run
        polled = now
        seen = board.read()
        if seen.ticks != last_ticks:
            last_ticks, last_progress = seen.ticks, now
        if stopping is not None and stopping.is_set() and not received:
            received.append(getattr(stopping, "signum", signal.SIGTERM))  # came before the fork
        if received and not forwarded:
            forwarded = True
            if stopping is not None:
                stopping.set()
            _signal(pid, received[0])  # SIGTERM, SIGINT or a scheduler's preemption signal
            kill_at = now + supervision.grace_s
            verdict = _Verdict("interrupted", "interrupted",
                               f"{signal.Signals(received[0]).name} received; the run did not "
                               f"stop within {supervision.grace_s:g} s and was killed")  # fmt: skip
        if wall_s is not None and not wall_signalled and now - started >= wall_s:
            wall_signalled = True
            _signal(pid, WALL_TIME_SIGNAL)
            kill_at = min(kill_at or float("inf"), now + supervision.grace_s)
            verdict = verdict or _Verdict("stopped", "wall_time",
                                          f"hard wall-time limit {stop['wall_time']}: the run did "
                                          f"not stop within {supervision.grace_s:g} s in "
                                          f"{seen.phase} and was killed")  # fmt: skip
        if now - last_progress >= stall_s and kill_at is None:
            kill_at = now
            verdict = _Verdict("failed", "stalled",
                               f"no progress for {stall_s:g} s in {seen.phase} after update "
                               f"{seen.step} (stop.stall); the run's process was killed",
                               )  # fmt: skip
        if kill_at is not None and now >= kill_at:
            _kill_group(child)
        if now >= next_beat:
            next_beat = now + supervision.heartbeat_s
            if now - last_progress < stall_s and not _beat(ledger, claim):
                _kill_group(child)
                child.join()
                raise LeaseLost(f"run {claim.run_id}: the lease is gone (declared lost or "
                                "taken by another worker); its process was stopped")  # fmt: skip
        child.join(supervision.poll_s)


def _beat(ledger: Ledger, claim: Claim) -> bool:
    """One heartbeat; False only when the lease is gone (an unreachable database is retried)."""
    try:
        return ledger.heartbeat(claim.run_id, lease=claim.lease)
    except RefusedWrite:
        return False
    except (LedgerError, SQLAlchemyError):
        return True


def _died(exitcode: int | None, answer: Mapping[str, Any], board: progress.Progress) -> _Verdict:
    if exitcode is not None and exitcode < 0:
        how = f"was killed by {signal.Signals(-exitcode).name}"
    else:
        how = f"exited with status {exitcode}"
    detail = (f"the run's process {how} in {board.phase} after update {board.step} "
              "without recording its end")  # fmt: skip
    if answer.get("error"):
        detail += f": {answer['error']}"
    return _Verdict("failed", "exception", detail + " (its output: the run's log artifact)")


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _kill_group(child: Any) -> None:
    """SIGKILL the child's process group: the child and anything the task forked."""
    if child.pid is None:
        return
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # not yet its own group leader, or gone
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child.pid, signal.SIGKILL)


def _read_result(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return {}
    finally:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def _forwarding() -> Iterator[list[int]]:
    """While the child runs, SIGTERM/SIGINT to this process are remembered (and forwarded)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum: int, _frame: Any) -> None:
        received.append(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _child(job: ChildJob) -> NoReturn:
    """The run's process: its own process group, the caller's environment and working
    directory, its output in the log, a fresh connection to the ledger."""
    code, answer = 0, {}
    try:
        os.setpgid(0, 0)
        _die_with(int(job.environment[SUPERVISOR_ENV]))
        for signum in (signal.SIGTERM, signal.SIGINT, WALL_TIME_SIGNAL):
            signal.signal(signum, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(job.environment)
        os.chdir(job.cwd)
        _redirect(job.log)
        progress.install(progress.ProgressBoard(job.board))
        with Ledger.open(job.url) as ledger:
            answer = {"outcome": asdict(job.run(ledger, job.log))}
    except LeaseLost as error:
        answer = {"lease_lost": str(error)}
    except BaseException as error:
        with contextlib.suppress(BaseException):
            traceback.print_exc()
        answer, code = {"error": f"{type(error).__name__}: {error}"[:2000]}, CHILD_FAILED
    try:
        temporary = job.result.with_suffix(".partial")
        temporary.write_text(json.dumps(answer, default=str))
        os.replace(temporary, job.result)
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
    finally:
        os._exit(code)


def _die_with(supervisor: int) -> None:
    """Forked by the supervisor itself (a ``campaign worker``): the kernel kills this process
    the moment its parent dies (Linux ``PR_SET_PDEATHSIG``), before another write. In every
    case a thread also follows the supervisor (the fork server's children, other systems)."""
    if os.getppid() == supervisor:
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != supervisor:  # it died before the prctl took effect
            os._exit(CHILD_FAILED)
    _follow_supervisor(supervisor)


def _follow_supervisor(supervisor: int) -> None:
    """A thread of the run's process that mirrors its supervisor: when the supervisor dies
    (``kill -9`` of a worker, a lost machine) the run dies with it, so its run becomes
    ``lost`` and resumable and never trains on without a heartbeat; when the supervisor is
    stopped (SIGSTOP, a paused VM) the run stops too, until the supervisor continues it."""

    def follow() -> None:
        while True:
            state = _process_state(supervisor)
            if state is None or state in ("Z", "X"):  # gone, or dead and not yet reaped
                os.killpg(0, signal.SIGKILL)
            if state in ("T", "t"):
                os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(0.2)

    threading.Thread(target=follow, name="follow-supervisor", daemon=True).start()


def _process_state(pid: int) -> str | None:
    """The one-letter state of process ``pid`` (``R``, ``S``, ``T``...), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0].decode()
    except FileNotFoundError:
        return None
    except (OSError, IndexError):  # no /proc here: liveness only
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return "R"


def _redirect(log: Path) -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    os.close(nothing)
    # Python's own streams onto the new descriptors (a caller may have replaced them).
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
