"""Whether a ledger that went away answers again, asked from a thread (docs/runs.md, faults).

A run keeps training while its ledger is away, and tries again to write (its metric points,
its checkpoints' records) from the training loop. A try costs what reaching the server costs:
nothing when the server refuses the connection (a restart), but the whole connect timeout
when nothing answers (a network cut, a machine lost), which would stall training for seconds
at every try. So once a try has failed, a thread asks the server (a connection and
``SELECT 1``, with the transactions' backoff), and the loop tries again only once it
answered. A SQLite ledger is a file: a try is cheap, there is nothing to ask.
"""

from __future__ import annotations

import os
import threading

from sqlalchemy import Engine

from campaign.ledger.outage import FIRST_WAIT_S, LONGEST_WAIT_S, answered, missed

_probes: dict[str, ReachProbe] = {}
_lock = threading.Lock()


class ReachProbe:
    """One ledger's probe in this process (:func:`probe_for`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._asking: threading.Thread | None = None  # while the server has not answered
        self._stopped = threading.Event()

    def went_away(self) -> None:
        """A try failed for an outage: ask in the background until the server answers."""
        if self.engine.dialect.name != "postgresql":
            return
        with _lock:
            if self._asking is None:
                self._asking = threading.Thread(target=self._ask, daemon=True,
                                                name="campaign-ledger-probe")
                self._asking.start()

    def worth_trying(self) -> bool:
        """False while the probe asks and the server has not answered yet."""
        return self._asking is None

    def stop(self) -> None:
        """Ask no more (its ledger was closed): the writers, if any, try for themselves."""
        self._stopped.set()
        with _lock:
            self._asking = None

    def _ask(self) -> None:
        wait_s = FIRST_WAIT_S
        while not self._stopped.is_set():
            try:
                with self.engine.connect() as conn:
                    conn.exec_driver_sql("SELECT 1")
            except Exception:  # any failure is "not yet"; the loop's own try says why
                # The loop skips its tries meanwhile, so the probe keeps this process's
                # outage clock going: its one deadline still counts from the first miss.
                missed()
                self._stopped.wait(wait_s)
                wait_s = min(wait_s * 2, LONGEST_WAIT_S)
                continue
            answered()
            with _lock:
                self._asking = None
            return


def _key(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def probe_for(engine: Engine) -> ReachProbe:
    """The probe of ``engine``'s ledger in this process (shared by its writers)."""
    with _lock:
        if _key(engine) not in _probes:
            _probes[_key(engine)] = ReachProbe(engine)
        return _probes[_key(engine)]


def forget(engine: Engine) -> None:
    """``engine``'s ledger was closed: its probe, if any, stops asking."""
    with _lock:
        probe = _probes.pop(_key(engine), None)
    if probe is not None:
        probe.stop()


def _none_in_a_child() -> None:
    """A forked child (a run forked by its task host) has no thread of its parent's: a probe
    copied asking would keep its writers from ever trying again."""
    global _probes, _lock
    _probes, _lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_none_in_a_child)
