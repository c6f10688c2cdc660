"""A ledger that blinks (a PostgreSQL restart, a dropped connection, a pooler's restart) is an
outage to ride out, not an error, for the processes that live through a campaign.

A run's process, its supervisor's claims and ends, a worker and a launcher open the ledger
"riding out" (:func:`riding_out`): a transaction whose connection was lost, or that cannot
connect, is tried again with backoff (0.25 s doubling to 5 s) for up to
``CAMPAIGN_LEDGER_OUTAGE_S`` seconds (default 600, docs/runs.md); past it the ledger's
``LedgerUnreachable`` ends a run ``interrupted`` (resumable, never ``failed``). A command the
user waits on gives up at once: a mistyped host is no outage. SQLite has no server to blink,
but its file can stop taking writes (a full volume, a read-only mount): ridden out the same
way, while workers claim nothing more (writable.py); its locks are waited out by the busy
timeout (connections.py).

A retried transaction is one that rolled back, so repeating it is safe, except the rare
COMMIT whose answer was lost with the connection: the write may be in the database already.
The metric writer's repeat is a no-op (points are keyed by segment, key and step); every other
write names a check that recognises it (:mod:`campaign.ledger.settled`: a claim by its lease
token, a run's end by its status and stop, a new row by its values), so nothing is done twice.
"""

from __future__ import annotations

import math
import os
import time

from sqlalchemy import Engine, exc

from campaign.errors import LedgerError
from campaign.ledger.file_state import CANNOT_WRITE_SIGNS

OUTAGE_ENV = "CAMPAIGN_LEDGER_OUTAGE_S"
DEFAULT_OUTAGE_S = 600.0  # 10 minutes: a server restart, a failover, a maintenance
FIRST_WAIT_S, LONGEST_WAIT_S = 0.25, 5.0
_OPTION = "campaign_outage_s"


def outage_s() -> float:
    """``CAMPAIGN_LEDGER_OUTAGE_S``, checked: seconds of 0 or more (0: give up at once)."""
    text = os.environ.get(OUTAGE_ENV)
    if text is None:
        return DEFAULT_OUTAGE_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise LedgerError(f"{OUTAGE_ENV}={text!r}: not a number of seconds of 0 or more")
    return seconds


def riding_out(engine: Engine, seconds: float | None = None) -> Engine:
    """``engine`` whose transactions ride out an outage of up to ``seconds`` (default: the
    environment's); shares the engine's pool."""
    return engine.execution_options(**{_OPTION: outage_s() if seconds is None else seconds})


# The server's own answers that mean "not now" rather than "not this": a connection failure
# (class 08, a pooler's too), the server shutting down or crashing under the session, or one
# that is starting and not yet taking connections.
_OUTAGE_STATES = ("57P01", "57P02", "57P03")
# A connection the server refused for good: a mistyped database or role, a password, the
# access rules. Waiting cannot help; the user must hear it at once.
_REFUSALS = ("does not exist", "authentication failed", "pg_hba.conf", "permission denied")


# psycopg's own words when a connection's answers stop matching its commands ("received 2
# results from command 'COMMIT'"): seen when the ledger's sessions are killed, or its server
# restarted, behind PgBouncer mid-command. The connection is unusable, the statement is not
# at fault; whether the COMMIT took effect is unknown, as for any lost connection.
_CONFUSED = "results from command"


def is_outage(error: exc.DBAPIError, dialect: str) -> bool:
    """A lost connection or a server that does not answer (PostgreSQL): not the statement's
    fault, worth waiting for. A refused password, a cancelled statement, a full disk or a lock
    not granted are answers, not an outage. SQLite's: a full or read-only file (it may be
    freed), never a lock (the busy timeout waits for those) nor a corrupt file."""
    if dialect == "sqlite":  # its file: full, or made read-only, may be freed again
        return any(sign in str(error.orig or error) for sign in CANNOT_WRITE_SIGNS)
    if error.connection_invalidated:
        return True
    if _CONFUSED in str(error.orig or error):
        return True
    if not isinstance(error, exc.OperationalError):
        return False
    state = getattr(error.orig, "sqlstate", None)
    if state is None:  # a connection that failed: the client's own words, the server's inside
        return not any(answer in str(error.orig) for answer in _REFUSALS)
    return state.startswith("08") or state in _OUTAGE_STATES


# When this process last saw the ledger come back from an outage it rode out (monotonic).
_came_back_at: float | None = None
# The outage this process is in: when one of its transactions first found the ledger away,
# and the last time one did. Every transaction's patience counts from the first (one deadline
# for the process: a run that stopped for an outage past the limit, then its supervisor and
# its worker, each give up at once instead of waiting a full limit again, docs/runs.md).
_away_since: float | None = None
_last_miss_s = 0.0
# Misses further apart than this, with no answer between, are two outages (a process that
# rides one out tries at least every LONGEST_WAIT_S).
SAME_OUTAGE_S = 60.0


def came_back() -> None:
    """An outage this process waited on has ended (the transaction went through)."""
    global _came_back_at, _away_since
    _came_back_at = time.monotonic()
    _away_since = None


def answered() -> None:
    """A transaction went through: an outage this process met, if any, is over."""
    if _away_since is not None:
        came_back()


def missed() -> float:
    """A transaction found the ledger away; the seconds this process has been in the outage."""
    global _away_since, _last_miss_s
    now = time.monotonic()
    if _away_since is None or now - _last_miss_s > SAME_OUTAGE_S:
        _away_since = now
    _last_miss_s = now
    return now - _away_since


def back_for_less_than(seconds: float) -> bool:
    """Whether this process saw the ledger return from an outage under ``seconds`` ago: a
    heartbeat judged then may be stale only because no run could beat during the outage, so
    no run is declared lost on it before its own process had a full lease to beat again."""
    return _came_back_at is not None and time.monotonic() - _came_back_at < seconds


class Backoff:
    """One transaction's patience with an outage: how long it has waited, and the next wait."""

    def __init__(self, engine: Engine) -> None:
        self.budget_s = float(engine.get_execution_options().get(_OPTION, 0.0))
        self.began: float | None = None
        self.wait_s = FIRST_WAIT_S

    @property
    def waited(self) -> bool:
        """Whether this transaction waited on an outage (and so, having gone through, saw the
        ledger come back)."""
        return self.began is not None

    def wait(self) -> bool:
        """Sleep before the next attempt; False when the outage outlasted the budget (counted
        from when this process first met it)."""
        now = time.monotonic()
        self.began = now if self.began is None else self.began
        away_s = max(missed(), now - self.began)
        if away_s + self.wait_s > self.budget_s:
            return False
        time.sleep(self.wait_s)
        self.wait_s = min(self.wait_s * 2, LONGEST_WAIT_S)
        return True
