"""The supervisor's watch over a run's process, as named states (docs/architecture.md).

A watched run is in one of four states, and moves only forward:

- ``RUNNING``: training; heartbeats go to the ledger, progress is read off the run's
  progress page, and the limits are watched (stall, hard wall time).
- ``STOPPING``: a stop was asked (a signal forwarded to the run, or the hard wall time
  signalled): the run checkpoints at its stop update and ends itself. It has ``grace_s``
  from the last progress to do so, never more than ``LONGEST_ENDING`` graces in all; a
  second signal ends the wait.
- ``KILLING``: the deadline passed or the run stalled: its process is killed, and the
  verdict (what the supervisor records, since the run could not) says why.
- ``ENDING``: the run recorded its own end in the ledger (a heartbeat was refused because
  the run is no longer running under our lease): no more heartbeats, it is on its way out.

A refused heartbeat whose run was declared lost or taken by another worker is no state: the
run's process is killed at once and :class:`LeaseLost` raised (another worker may run it).
Each rule is one method; :meth:`RunWatch.tick` applies them in order, once per poll.
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from campaign.errors import LeaseLost
from campaign.host.client import Child
from campaign.host.processes import parent_pid, process_state, signal_name
from campaign.loop import progress_page
from campaign.loop.signals import WALL_TIME_SIGNAL
from campaign.loop.stop import parse_duration

DEFAULT_STALL_S = 600.0
LEASE_GONE = "the lease is gone (declared lost or taken by another worker); its process was stopped"
LONGEST_ENDING = 10  # graces a signalled run that still makes progress may take to end


class WatchState(enum.Enum):
    RUNNING = "running"
    STOPPING = "stopping"
    KILLING = "killing"
    ENDING = "ending"


@dataclass
class Verdict:
    """What the parent records when the child does not record its own end."""

    status: str
    cause: str
    detail: str


@dataclass
class Signals:
    """What reached this process while the child ran: stop signals, and a continue."""

    received: list[int]
    continued: bool = False


@dataclass
class Limits:
    """The run's own limits, from its frozen config, and the supervisor's timings."""

    wall_s: float | None
    wall_time: str | None
    stall_s: float
    grace_s: float
    heartbeat_s: float

    @classmethod
    def of(cls, config: Mapping[str, Any], grace_s: float, heartbeat_s: float) -> Limits:
        stop = config.get("stop", {})
        stall = parse_duration(stop.get("stall"))
        return cls(parse_duration(stop.get("wall_time")), stop.get("wall_time"),
                   DEFAULT_STALL_S if stall is None else stall, grace_s, heartbeat_s)


@dataclass
class RunWatch:
    """One run's process under watch. ``beat`` sends a heartbeat (False: refused);
    ``still_ours`` says, after a refusal, whether the run simply ended (True) or was taken."""

    run_id: str
    child: Child
    board: progress_page.ProgressBoard
    limits: Limits
    signals: Signals
    stopping: Any  # the worker's stop request (a threading.Event), or None
    beat: Callable[[], bool]
    still_ours: Callable[[], bool]
    state: WatchState = WatchState.RUNNING
    verdict: Verdict | None = None
    started: float = field(default_factory=time.monotonic)
    last_progress: float = 0.0
    last_ticks: int = -1
    next_beat: float = 0.0
    kill_at: float | None = None  # STOPPING: when the run's process is killed
    latest_kill: float | None = None  # how far progress may push ``kill_at``
    forwarded: bool = False  # a stop signal was passed on to the run
    wall_signalled: bool = False

    def __post_init__(self) -> None:
        self.last_progress = self.next_beat = self.started

    def tick(self, now: float) -> None:
        """One poll: every rule, in order."""
        self.take_stop_requests(now)
        seen = self.observe(now)
        self.forward_stop(now)
        self.enforce_wall_time(now, seen)
        self.detect_stall(now, seen)
        self.kill_when_due(now)
        self.heartbeat(now)

    def take_stop_requests(self, now: float) -> None:
        """A stop the worker was asked for (before the fork, or a preemption signal its own
        handler caught) counts as one received here; a continue after this process was
        stopped with the run is no stall of the run."""
        if self.stopping is not None and self.stopping.is_set() and not self.signals.received:
            self.signals.received.append(getattr(self.stopping, "signum", signal.SIGTERM))
        if self.signals.continued:
            self.signals.continued, self.last_progress = False, now

    def observe(self, now: float) -> progress_page.Progress:
        """The run's progress page; progress while stopping earns more time (to a bound). A
        run's process or its task host found stopped while this process runs is continued:
        a host stopped alone would never report the run's end (nor its replay child's), and
        the run would wait for ever (SLURM stops a whole job and continues it whole)."""
        seen = self.board.read()
        if process_state(self.child.pid) == "T":  # stopped with this process, which runs
            signal_to(self.child.pid, signal.SIGCONT)
        host = parent_pid(self.child.pid)  # the task host that forked the run's process
        if host is not None and host > 1 and process_state(host) == "T":
            signal_to(host, signal.SIGCONT)
        if seen.ticks != self.last_ticks:
            self.last_ticks, self.last_progress = seen.ticks, now
            if self.kill_at is not None and self.latest_kill is not None:
                self.kill_at = min(max(self.kill_at, now + self.limits.grace_s), self.latest_kill)
        return seen

    def forward_stop(self, now: float) -> None:
        """RUNNING -> STOPPING on the first stop signal, passed on to the run; a second one
        ends the wait."""
        if self.forwarded and len(self.signals.received) > 1:
            self.kill_at = now
        if self.signals.received and not self.forwarded:
            self.forwarded = True
            first = self.signals.received[0]
            if self.stopping is not None:
                self.stopping.by(first)
            self.board.request_stop(first)  # first on the page: read if the signal came early
            signal_to(self.child.pid, first)  # SIGTERM, SIGINT or a preemption signal
            grace = self.limits.grace_s
            self.kill_at, self.latest_kill = now + grace, now + LONGEST_ENDING * grace
            self._enter(WatchState.STOPPING)

    def enforce_wall_time(self, now: float, seen: progress_page.Progress) -> None:
        """RUNNING -> STOPPING at the hard wall time: the run is signalled to checkpoint and
        stop; the verdict stands if it must be killed."""
        wall_s = self.limits.wall_s
        if wall_s is None or self.wall_signalled or now - self.started < wall_s:
            return
        self.wall_signalled = True
        if not self.forwarded:
            self.board.request_stop(WALL_TIME_SIGNAL)
        signal_to(self.child.pid, WALL_TIME_SIGNAL)
        grace = self.limits.grace_s
        self.kill_at = min(self.kill_at or float("inf"), now + grace)
        self.latest_kill = min(self.latest_kill or float("inf"), now + LONGEST_ENDING * grace)
        self.verdict = self.verdict or Verdict(
            "stopped", "wall_time", f"hard wall-time limit {self.limits.wall_time}: the run did "
            f"not stop within {grace:g} s in {seen.phase} and was killed")
        self._enter(WatchState.STOPPING)

    def detect_stall(self, now: float, seen: progress_page.Progress) -> None:
        """No progress for ``stop.stall``: killed at once (unless a kill is already due)."""
        if now - self.last_progress < self.limits.stall_s or self.kill_at is not None:
            return
        self.kill_at = now
        self.verdict = Verdict(
            "failed", "stalled", f"no progress for {self.limits.stall_s:g} s in {seen.phase} "
            f"after update {seen.step} (stop.stall); the run's process was killed")

    def kill_when_due(self, now: float) -> None:
        """-> KILLING when the deadline passed; an interrupted verdict is said only when it is
        true (the run was killed after a stop signal)."""
        if self.kill_at is None or now < self.kill_at:
            return
        if self.forwarded and self.verdict is None:
            self.verdict = Verdict(
                "interrupted", "interrupted", f"{signal_name(self.signals.received[0])} "
                f"received; the run did not stop within {self.limits.grace_s:g} s and was "
                "killed")
        self.child.kill()
        self._enter(WatchState.KILLING)

    def heartbeat(self, now: float) -> None:
        """A heartbeat every ``heartbeat_s`` while the run progresses; a refused one means the
        run ended itself (-> ENDING) or was taken away (:class:`LeaseLost`)."""
        if now < self.next_beat or self.state is WatchState.ENDING:
            return
        self.next_beat = now + self.limits.heartbeat_s
        if now - self.last_progress >= self.limits.stall_s or self.beat():
            return
        if not self.still_ours():
            self.child.kill()
            self.child.join()
            raise LeaseLost(f"run {self.run_id}: {LEASE_GONE}")
        self._enter(WatchState.ENDING)

    def _enter(self, state: WatchState) -> None:
        """Move forward only: KILLING and ENDING are never left for an earlier state."""
        order = list(WatchState)
        if order.index(state) > order.index(self.state):
            self.state = state


def signal_to(pid: int, signum: int) -> None:
    """``kill(pid, signum)``; a process already gone is no error."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)
