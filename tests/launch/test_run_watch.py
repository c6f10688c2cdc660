"""The supervisor's watch over a real run process, state by state (launch/run_watch.py): a
child of the task host that sleeps, a real progress page, and the supervisor's own clock."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from campaign.errors import LeaseLost
from campaign.host import calls
from campaign.launch.run_watch import Limits, RunWatch, Signals, WatchState
from campaign.loop.progress_page import ProgressBoard


def deaf_sleep(seconds: float) -> None:
    """A run that ignores SIGTERM (its task's own handler, say), then sleeps (the child)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(seconds)


def _ignores_sigterm(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            ignored = next(line for line in status if line.startswith("SigIgn:"))
    except (OSError, StopIteration):
        return False
    return bool(int(ignored.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def _watch(tmp_path: Path, *, stall_s: float = 600.0, grace_s: float = 0.3,
           beat: bool = True, ours: bool = True, deaf: bool = False) -> RunWatch:
    child = calls.start(deaf_sleep if deaf else time.sleep, [600])
    deadline = time.monotonic() + 30  # a signal before the child's own handler: not its
    while deaf and not _ignores_sigterm(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    board = ProgressBoard(tmp_path / "progress", create=True)
    limits = Limits(wall_s=None, wall_time=None, stall_s=stall_s, grace_s=grace_s,
                    heartbeat_s=0.05)
    return RunWatch("run-1", child, board, limits, Signals([]), None,
                    beat=lambda: beat, still_ours=lambda: ours)


def _until(watch: RunWatch, done: float) -> None:
    deadline = time.monotonic() + done
    while time.monotonic() < deadline and watch.child.exitcode is None:
        watch.tick(time.monotonic())
        watch.child.join(0.02)


def test_a_run_without_progress_is_killed_as_stalled(tmp_path: Path) -> None:
    watch = _watch(tmp_path, stall_s=0.2)
    _until(watch, 5)
    assert watch.state is WatchState.KILLING and watch.child.exitcode is not None
    assert watch.verdict is not None and (watch.verdict.status, watch.verdict.cause) == (
        "failed", "stalled")


def test_a_stop_signal_is_forwarded_and_a_run_that_ignores_it_is_killed_after_the_grace(
        tmp_path: Path) -> None:
    """The sleeping child ignores the signal (its own handler, installed before the signal
    is sent: a host's child takes back SIGTERM's default action first, so a signal sent
    earlier raced it): STOPPING, then KILLING at the grace, and the verdict says the signal
    was received."""
    watch = _watch(tmp_path, deaf=True)
    watch.tick(time.monotonic())
    assert watch.state is WatchState.RUNNING
    watch.signals.received.append(signal.SIGTERM)
    watch.tick(time.monotonic())
    assert watch.forwarded and watch.state is WatchState.STOPPING and watch.kill_at is not None
    assert watch.board.requested_stop() == signal.SIGTERM  # on the page before it was sent
    _until(watch, 5)
    assert watch.state is WatchState.KILLING and watch.child.exitcode is not None
    assert watch.verdict is not None and (watch.verdict.status, watch.verdict.cause) == (
        "interrupted", "interrupted")
    assert "SIGTERM received" in watch.verdict.detail


def test_a_refused_heartbeat_of_a_run_that_ended_itself_stops_the_beats(tmp_path: Path) -> None:
    watch = _watch(tmp_path, beat=False, ours=True)
    watch.tick(time.monotonic() + 1)
    assert watch.state is WatchState.ENDING
    watch.child.kill()
    watch.child.join()


def test_a_run_taken_by_another_worker_is_killed_and_raises(tmp_path: Path) -> None:
    watch = _watch(tmp_path, beat=False, ours=False)
    try:
        watch.tick(time.monotonic() + 1)
    except LeaseLost as lost:
        assert "run-1" in str(lost)
    else:
        raise AssertionError("LeaseLost was not raised")
    assert watch.child.exitcode is not None
