"""Signals a run answers: SIGTERM/SIGINT (and a scheduler's preemption signal) end it cleanly.

The handler only remembers the signal; the loop finishes the current update,
checkpoints and ends the run ``interrupted`` (cause ``interrupted`` or
``preempted``). SIGUSR1 is the supervisor's hard wall-time limit: the run ends
``stopped``/``wall_time`` after the current update. Handlers are installed
only in the main thread (Python's rule) and restored when the run is cleaned up.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Sequence
from typing import Any

from campaign.loop import progress_page
from campaign.loop.stop import StopDecision

WALL_TIME_SIGNAL = signal.SIGUSR1


class SignalLatch:
    """Remembers the last stop signal received while installed."""

    def __init__(self, preempt_signals: Sequence[int] = ()) -> None:
        self.preempt_signals = tuple(preempt_signals)
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, _frame: Any) -> None:
            self.received = signum

        for signum in (signal.SIGTERM, signal.SIGINT, WALL_TIME_SIGNAL, *self.preempt_signals):
            self._previous[signum] = signal.signal(signum, handler)
        # A stop its supervisor sent before these handlers were in place (a signal the process
        # ignored or had no handler for yet) is written on the run's page: never lost.
        pending = progress_page.requested_stop()
        if pending is not None and self.received is None:
            self.received = pending

    def request(self, signum: int) -> None:
        """Act as if ``signum`` had arrived (a worker that received it between runs)."""
        self.received = signum

    def decision(self) -> StopDecision:
        """How the run ends after the signal received: stopped at the supervisor's hard wall
        time, interrupted by a scheduler's preemption, or interrupted."""
        if self.wall_time:
            detail = "the supervisor's hard wall-time limit was reached"
            return StopDecision("stopped", "wall_time", detail, "update")
        if self.preempted:
            detail = f"{self.name} received: the scheduler preempts or times out the job"
            return StopDecision("interrupted", "preempted", detail, "update")
        return StopDecision("interrupted", "interrupted", f"{self.name} received", "update")

    @property
    def wall_time(self) -> bool:
        return self.received == WALL_TIME_SIGNAL

    @property
    def preempted(self) -> bool:
        return self.received is not None and self.received in self.preempt_signals

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received is not None else ""

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
