"""The supervisor: a run executes in a child process, and its worker makes sure it ends.

Why a child process: task code is a user's, and it can hang in ``loss()``,
call ``sys.exit``, ``os._exit``, segfault, fork, or print. A thread that
stamps the heartbeat regardless kept such runs ``running`` for ever. Here
the parent (a worker, or ``campaign run``) holds the lease and the
heartbeat, and stamps only while the child's progress page
(:mod:`campaign.loop.progress_page`) moves. It enforces, on the run's behalf:

- the wall time as a hard limit: SIGUSR1 at the limit (the loop ends
  ``stopped``/``wall_time`` after its update), SIGKILL ``grace_s`` later
  unless the run is visibly ending (its ticks move: a checkpoint, the export),
  and at the latest ten graces later;
- the stall limit (``stop.stall``, default 10 minutes without a tick):
  the child's process group is killed and the run ends ``failed``/``stalled``
  with the phase and update it was stuck in;
- SIGTERM/SIGINT (and a scheduler's preemption signal) to the parent:
  forwarded, then a kill after the grace (the run ends ``interrupted``);
- a child that exits, is killed or segfaults without recording its end:
  ``failed``/``exception`` with its exit status or signal.

The child (:mod:`campaign.launch.run_process`) is forked from this process's
task host (:mod:`campaign.host`): a run starts in milliseconds, and this
process imports no torch. The host ignores the scheduler's signals, so a
SIGTERM or SIGUSR2 sent to every process of a job (SLURM's way) reaches the
run and this supervisor only: the run checkpoints at its update and ends
``interrupted``, and this process forwards what it received without reading
the host's calm as the run's end. When this process is stopped and continued,
it continues the run's process group too (the run stops with it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from campaign.errors import LeaseLost, LedgerUnreachable, RunSetupFailed
from campaign.host import calls
from campaign.host.client import Child, HostError
from campaign.host.processes import ended_how, killed_from_outside, signal_name
from campaign.launch.defaults import RUN_PRELOAD
from campaign.launch.kills import how_killed, killed_end, oom_kills
from campaign.launch.pending_ends import leave_pending_end
from campaign.launch.run_process import (
    ARTIFACTS_ENV,
    SUPERVISOR_ENV,
    ChildJob,
    run_child,
)
from campaign.launch.run_watch import Limits, RunWatch, Signals, Verdict
from campaign.ledger import Claim, Ledger, LedgerError, RefusedWrite, StopRecord
from campaign.ledger.spill import SPILL_NAME
from campaign.loop import progress_page
from campaign.loop.ledger_away import record_left_waiting
from campaign.loop.outcome import RunOutcome
from campaign.loop.run_files import record_file


@dataclass(frozen=True)
class Supervision:
    """How a run is watched: ``grace_s`` between a graceful signal and the kill."""

    heartbeat_s: float
    grace_s: float = 30.0
    poll_s: float = 0.05


def supervise(
    ledger: Ledger,
    claim: Claim,
    body: tuple[str, list[Any]],
    supervision: Supervision,
    *,
    folder: Path,
    config: Mapping[str, Any],
    stopping: Any = None,
    task: str | None = None,
) -> RunOutcome:
    """Run ``function(*args, ledger, log_path)`` in a child of the task host and return the
    run's outcome, whatever the child does. ``body``: ``("module:function", args)``, the
    args JSON values (the child gets them through the host's channel, never pickled).
    ``task``: the task reference (a built-in task's preloads are imported in the host).
    ``stopping``: the worker's stop request (set here when a stop signal arrives; a request
    already set is forwarded at once). Raises :class:`LeaseLost` when the run was taken away."""
    logs = folder.absolute() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stem = f"segment-{claim.ordinal}"
    log, board_path = logs / f"{stem}.log", logs / f".{stem}.progress"
    result = logs / f".{stem}.json"
    job = ChildJob(ledger.engine.url.render_as_string(hide_password=False), body[0],
                   list(body[1]), str(log), str(board_path), str(result))
    environment = {**os.environ, SUPERVISOR_ENV: str(os.getpid()),
                   # task code (a tokenizer's cache) finds the artifacts folder
                   ARTIFACTS_ENV: str(folder.absolute().parent)}
    result.unlink(missing_ok=True)
    board = progress_page.ProgressBoard(board_path, create=True, step=claim.start_step)
    oom_before = oom_kills()  # the OOM killer's count, to name it if it kills the run
    child: Child | None = None
    try:
        with _forwarding(lambda: child) as signals:
            try:
                child = calls.start(run_child, [job.document()],
                                    follow=os.getpid(), stop_with=True, env=environment,
                                    task=task, preload=RUN_PRELOAD,
                                    title=f"campaign run {claim.run_id}")
            except HostError as error:  # a claimed run must still end, and say why
                detail = f"the task host could not start the run's process: {error}"
                ledger.finish(claim.run_id, "failed", StopRecord("exception", 0, "setup", detail),
                              lease=claim.lease)
                raise RunSetupFailed(f"run {claim.run_id}: {detail}") from None
            verdict = _watch(ledger, claim, child, board, supervision, config, signals, stopping)
        if signals.received and stopping is not None:  # it came as the run was ending
            stopping.by(signals.received[0])
    finally:
        if child is not None:
            child.kill()
            child.join()
        seen = board.read()
        board.close()
        board_path.unlink(missing_ok=True)
        answer = _read_result(result)  # read (and removed) whatever ended the watch
    if "lease_lost" in answer:
        raise LeaseLost(answer["lease_lost"])
    if "outcome" in answer:  # the child recorded its end
        return RunOutcome(**answer["outcome"])
    with contextlib.suppress(LedgerUnreachable):  # (still away: the end is decided here)
        row = ledger.run(claim.run_id)
        if row.status != "running":  # it did, though its answer was lost
            return RunOutcome(row.id, row.status, str(row.stop_cause), int(row.stop_step or 0),
                              str(row.stop_detail or ""))
    if verdict is None and signals.received:  # a job-wide signal before the run's handler
        verdict = Verdict("interrupted", "interrupted",
                           f"{signal_name(signals.received[0])} received; the run's process "
                           f"{ended_how(child.exitcode)} before it could checkpoint")
    verdict = verdict or _died(ledger, claim, child, answer, seen, oom_before)
    stop = StopRecord(verdict.cause, seen.step, seen.phase, verdict.detail)
    with contextlib.suppress(OSError, LedgerError, SQLAlchemyError):
        if log.exists():  # before the end: an ended run takes no more rows
            record_file(ledger, claim.run_id, "log", log, seen.step, lease=claim.lease)
    try:
        if (folder / SPILL_NAME).exists():  # points the run kept through an outage, then left
            with ledger.metric_writer(claim.run_id, claim.segment_id, lease=claim.lease,
                                      spill=folder / SPILL_NAME) as leftover:
                leftover.write_spilled()
        record_left_waiting(ledger, folder, claim.run_id, claim.lease)  # its checkpoints
        ledger.finish(claim.run_id, verdict.status, stop, lease=claim.lease)
    except LedgerUnreachable:  # still away: the next worker here writes it (pending_ends.py)
        leave_pending_end(folder, claim, verdict.status, stop)
        raise
    return RunOutcome(claim.run_id, verdict.status, verdict.cause, seen.step, verdict.detail)


def _watch(ledger: Ledger, claim: Claim, child: Child, board: progress_page.ProgressBoard,
           supervision: Supervision, config: Mapping[str, Any], signals: Signals,
           stopping: Any) -> Verdict | None:
    """Watch the child until it exits (:class:`RunWatch`); the end the parent must record if
    the child did not (None: it recorded its own, or died on its own)."""
    limits = Limits.of(config, supervision.grace_s, supervision.heartbeat_s)
    quick = ledger.impatient()  # a beat skipped in an outage; the watch must keep watching
    watch = RunWatch(claim.run_id, child, board, limits, signals, stopping,
                     beat=lambda: _beat(quick, claim),
                     still_ours=lambda: _still_ours(quick, claim))
    while child.exitcode is None:
        watch.tick(time.monotonic())
        child.join(supervision.poll_s)
    return watch.verdict


def _beat(ledger: Ledger, claim: Claim) -> bool:
    """One heartbeat; False when the run is no longer running under our lease (an unreachable
    database is retried at the next beat)."""
    try:
        return ledger.heartbeat(claim.run_id, lease=claim.lease)
    except RefusedWrite:
        return False
    except (LedgerError, SQLAlchemyError):
        return True


def _still_ours(ledger: Ledger, claim: Claim) -> bool:
    """After a refused heartbeat: True when the run simply ended (the child recorded it),
    False when it was declared lost or taken by another worker."""
    try:
        record = ledger.run(claim.run_id)
    except (LedgerError, SQLAlchemyError):
        return True  # cannot tell now: the next beat asks again
    return record.status not in ("running", "lost")


def _died(ledger: Ledger, claim: Claim, child: Child, answer: Mapping[str, Any],
          board: progress_page.Progress, oom_before: int | None) -> Verdict:
    """The end of a run whose process ended without recording one: killed by a signal nobody
    of ours sent (launch/kills.py: interrupted, resumable), or its body's own failure."""
    exitcode = child.exitcode
    if killed_from_outside(exitcode, child.host_gone) and not answer.get("error"):
        how = how_killed(exitcode or 0, child.host_gone, oom_before)
        try:
            status, detail = killed_end(ledger, claim, how, board)
        except LedgerUnreachable:  # decided without its earlier kills: resumable all the same
            status, detail = "interrupted", (
                f"the run's process {how} in {board.phase} after update {board.step}, while "
                "the ledger was away (this kill is not counted among its killed events)")
        return Verdict(status, "killed", detail)
    detail = (f"the run's process {ended_how(exitcode)} in {board.phase} after update "
              f"{board.step} without recording its end")
    if answer.get("error"):
        detail += f": {answer['error']}"
    if answer.get("resumable"):  # the ledger was away even for its end: resume it later
        return Verdict("interrupted", "ledger_unreachable", detail)
    return Verdict("failed", "exception", detail + " (its output: the run's log artifact)")


def _read_result(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return {}
    finally:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def _forwarding(child: Callable[[], Child | None]) -> Iterator[Signals]:
    """While the child runs: SIGTERM/SIGINT to this process are remembered (the watch forwards
    them); a SIGCONT after this process was stopped continues the run's process group."""
    signals = Signals([])
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return

    def stop_handler(signum: int, _frame: Any) -> None:
        signals.received.append(signum)

    def continue_handler(_signum: int, _frame: Any) -> None:
        signals.continued = True
        process = child()
        if process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGCONT)

    wanted = {signal.SIGTERM: stop_handler, signal.SIGINT: stop_handler,
              signal.SIGCONT: continue_handler}
    previous = {s: signal.signal(s, handler) for s, handler in wanted.items()}
    try:
        yield signals
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
