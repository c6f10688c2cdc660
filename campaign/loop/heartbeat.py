"""The run's heartbeat: a thread that stamps the run so that others can tell it is alive.

A thread, not a call in the loop: a long update (or a long validation) must
not look like a dead worker. A refused heartbeat means the lease is gone (the
run was declared lost, perhaps reclaimed by another worker): the loop is told
to stop and write nothing more. A database that cannot be reached (or a busy
connection pool) is retried at the next beat; if it stays away past the limit,
others declare the run lost. Anything else raised by a beat is a defect: the
thread stops and the loop re-raises it at its next check instead of the error
being swallowed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sqlalchemy.exc import SQLAlchemyError

from campaign.ledger import LedgerError, RefusedWrite


class Heartbeat:
    """Calls ``beat()`` every ``every_s`` seconds until stopped; ``beat`` returns False when the
    run is no longer held."""

    def __init__(self, beat: Callable[[], bool], every_s: float | None, name: str) -> None:
        """``every_s`` None: no thread (a supervisor beats for the run, see launch/supervisor)."""
        self._beat, self.every_s, self.name = beat, every_s, name
        self.lease_lost = threading.Event()
        self.failure: BaseException | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.every_s is None:
            return
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(self.every_s or 0):
            try:
                held = self._beat()
            except RefusedWrite:
                held = False
            except (LedgerError, SQLAlchemyError):
                continue  # unreachable or the pool exhausted for now: the next beat tries again
            except BaseException as error:  # a defect: hand it to the loop, do not hide it
                self.failure = error
                return
            if not held:
                self.lease_lost.set()
                return

    def check(self) -> None:
        """Re-raise in the caller's thread a defect the heartbeat thread met."""
        if self.failure is not None:
            raise RuntimeError(f"the heartbeat failed: {self.failure!r}") from self.failure

    def stop(self) -> None:
        """Stop beating and wait for the thread (a daemon thread inside a database call while the
        interpreter exits can abort it)."""
        self._stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
