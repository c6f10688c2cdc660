"""Engines and transactions for the two supported databases.

Everything that depends on the database engine at connection level lives
here: URL resolution, SQLite pragmas and ``BEGIN IMMEDIATE``, PostgreSQL
connect timeouts, the retry policy, and the translation of driver errors into
the ledger's own errors.

Why ``BEGIN IMMEDIATE`` on SQLite: a deferred transaction that reads and then
writes upgrades its lock at the write; if another connection wrote in between,
SQLite fails at once with "database is locked" regardless of the busy timeout
(the snapshot is stale, waiting cannot help). Taking the write lock at BEGIN
makes writers queue on the busy timeout instead. Readers use plain deferred
transactions and, in WAL mode, never block writers.
"""

from __future__ import annotations

import os
import random
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from sqlalchemy import Connection, Engine, create_engine, event, exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import StaticPool

from campaign.errors import (
    LedgerError,
    LedgerUnreachable,
    LedgerUnwritable,
    LedgerUrlError,
    NotALedger,
    RefusedWrite,
)
from campaign.ledger.file_state import CANNOT_WRITE_SIGNS, why_unwritable
from campaign.ledger.outage import Backoff, answered, came_back, is_outage, riding_out

TCP_USER_TIMEOUT_S = 30  # a PostgreSQL server silent this long on a sent request is gone
MAX_BUSY_TIMEOUT_S = 2_000_000  # about 23 days; SQLite's busy timeout is a 32-bit ms count


def sqlite_busy_timeout_s() -> float:
    """How long a SQLite writer waits for another's lock (``CAMPAIGN_SQLITE_BUSY_TIMEOUT_S``, 60:
    a shared file on slow storage may need more); a command gives up after one such wait. Read
    when a connection is made, not when this module is imported: a run is a child of a task
    host that imported it earlier, and it takes its requester's environment."""
    value = os.environ.get("CAMPAIGN_SQLITE_BUSY_TIMEOUT_S") or "60"
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= MAX_BUSY_TIMEOUT_S:  # nan and inf too; SQLite takes 32-bit ms
        raise LedgerError(f"CAMPAIGN_SQLITE_BUSY_TIMEOUT_S={value!r}: not a number of seconds "
                          f"above 0 and at most {MAX_BUSY_TIMEOUT_S:,}")
    return seconds


# A run's process waits out up to this many busy timeouts in a row (a lock held 75 s by a
# colleague's shell must not end a day of training); then its run ends resumable.
RUN_LOCK_ATTEMPTS = 5
_LOCK_ATTEMPTS_OPTION = "campaign_lock_attempts"
POSTGRES_CONNECT_TIMEOUT_S = 5
IDLE_IN_TRANSACTION_S = 10
MAX_ATTEMPTS = 6
REFUSAL_PREFIX = "campaign ledger refused"

_WRITE_OPTION = "campaign_write"
_RETRYABLE_SQLSTATES = {"40001", "40P01"}  # serialization_failure, deadlock_detected
_T = TypeVar("_T")


def parse_url(text: str) -> URL:
    """Parse and normalise a ledger URL; refuse anything we do not support.

    ``postgresql://`` and ``postgres://`` mean psycopg 3, the driver we ship
    with (SQLAlchemy would otherwise look for psycopg2).
    """
    try:
        url = make_url(text)
        url.port  # noqa: B018 - a port that is not a number raises here, not at connect time
    except (exc.ArgumentError, ValueError, TypeError):
        raise LedgerUrlError(
            f"malformed ledger URL {_masked(text)!r}: expected sqlite:///PATH or "
            "postgresql+psycopg://USER@HOST:PORT/DATABASE"
        ) from None
    if url.host and "@" in url.host:  # a password's '@': the rest of it would be the "host"
        raise LedgerUrlError(
            f"ledger URL {_masked(text)!r}: its password holds an '@': percent-encode it as "
            "%40 (postgresql://USER:PASS%40WORD@HOST/DB)"
        )
    if url.drivername in ("postgresql", "postgres", "postgresql+psycopg"):
        return url.set(drivername="postgresql+psycopg")
    if url.drivername in ("sqlite", "sqlite+pysqlite"):
        return url.set(drivername="sqlite")
    raise LedgerUrlError(
        f"unsupported ledger URL {safe_url(url)!r}: the ledger runs on sqlite:/// or postgresql://"
    )


def _masked(text: str) -> str:
    """A URL too malformed to parse, with anything that may be a password replaced."""
    text = re.sub(r"(://[^/@:]*:).*@", r"\1***@", text)  # up to the last @: a / may be in it
    return re.sub(r"((?:ssl)?password=)[^&]*", r"\1***", text, flags=re.IGNORECASE)


def safe_url(url: URL) -> str:
    """The URL as it may be printed: never with its password, wherever it sits (the userinfo,
    or a query parameter such as ``?password=`` that libpq also reads)."""
    secret = {k: "***" for k in url.query if "pass" in k.lower()}
    shown = url.update_query_dict(secret) if secret else url
    return shown.render_as_string(hide_password=True).replace("%2A%2A%2A", "***")


def sqlite_path(url: URL) -> Path | None:
    """The database file of a SQLite URL; None for in-memory or PostgreSQL."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database)


def create_ledger_engine(url: URL, *, read_only: bool = False) -> Engine:
    """An engine configured for the ledger's transaction discipline.

    ``read_only``: the database itself refuses every write on this engine's
    connections (SQLite opened with ``mode=ro``; PostgreSQL sessions with
    ``default_transaction_read_only``), so a viewer cannot write by mistake.
    """
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url, read_only=read_only)
    options = f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_S * 1000}"
    if read_only:
        options += " -c default_transaction_read_only=on"
    engine = create_engine(
        url,
        pool_pre_ping=True,
        connect_args={
            "connect_timeout": POSTGRES_CONNECT_TIMEOUT_S,
            "application_name": "campaign",
            # Our transactions never wait on anything but the database: one left open by a
            # process that was paused or hung (SIGSTOP, a debugger, a frozen VM) would hold
            # its row locks forever. The server ends such a session and frees the locks.
            "options": options,
            # Never a server-side prepared statement: behind a pooler in transaction mode
            # (PgBouncer, docs/clusters.md) the next transaction may run on another server
            # connection, where it does not exist.
            "prepare_threshold": None,
            # A server that vanished without closing (a node lost, a network cut) is noticed in
            # tens of seconds, not the kernel's 15 minutes: probes on an idle connection, and a
            # bound on data the server never acknowledges. Then it is an outage to ride out.
            "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
            "keepalives_count": 3, "tcp_user_timeout": TCP_USER_TIMEOUT_S * 1000,
        },
    )
    if read_only:  # again per transaction: a pooler (PgBouncer) drops the session's options
        event.listen(engine, "begin", _read_only_transaction)
    return engine


def _read_only_transaction(connection: Connection) -> None:
    connection.exec_driver_sql("SET TRANSACTION READ ONLY")


def _sqlite_engine(url: URL, *, read_only: bool = False) -> Engine:
    path = sqlite_path(url)
    if path is not None and not path.parent.exists():
        raise LedgerUnreachable(
            f"cannot open SQLite ledger {str(path)!r}: "
            f"directory {str(path.parent)!r} does not exist"
        )
    kwargs: dict[str, Any] = {
        "connect_args": {"timeout": sqlite_busy_timeout_s(), "check_same_thread": False}
    }
    if path is None:
        kwargs["poolclass"] = StaticPool  # one shared in-memory database
    elif path.exists() and (read_only or _read_only_place(path)):
        # Asked for (a viewer) or forced by a read-only mount (an archive disk, a colleague's
        # share): SQLite refuses every write. On a read-only mount SQLite cannot create its WAL
        # index beside the file, so unless a writer elsewhere keeps one, the file is opened
        # immutable; elsewhere it is read live, seeing every commit.
        mounted = _read_only_place(path)
        live = not mounted or any(path.with_name(path.name + s).exists() for s in ("-wal", "-shm"))
        uri = f"file:{quote(str(path))}?mode=ro" + ("" if live else "&immutable=1")
        kwargs["creator"] = lambda: sqlite3.connect(uri, uri=True, check_same_thread=False,
                                                    timeout=sqlite_busy_timeout_s())
    engine = create_engine(url, **kwargs)
    event.listen(engine, "connect", _sqlite_on_connect)
    event.listen(engine, "begin", _sqlite_on_begin)
    event.listen(engine, "checkin", _sqlite_on_checkin)
    return engine


def _read_only_place(path: Path) -> bool:
    """True when nobody can write beside ``path``: its filesystem is mounted read-only."""
    try:
        return bool(os.statvfs(path.parent).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _sqlite_on_checkin(dbapi_connection: Any, _record: Any) -> None:
    # A metric writer may have switched per-row foreign key checks off on its
    # connection (see bulk_metric_connection); no one else gets it that way.
    if dbapi_connection is not None:
        dbapi_connection.execute("PRAGMA foreign_keys = ON")


def bulk_metric_connection(engine: Engine) -> Any:
    """A pooled connection for a metric writer, as a SQLAlchemy pool proxy.

    On SQLite, per-row foreign key checks cost 12-20% of ingest. Every row of
    one writer carries the same (run, segment) pair, which the writer checks
    once per batch inside the batch's transaction, so the per-row check is
    switched off on this connection only; returning it to the pool switches
    it back on.
    """
    raw = engine.raw_connection()
    if engine.dialect.name == "sqlite":
        raw.driver_connection.execute("PRAGMA foreign_keys = OFF")
    return raw


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Hand transaction control to us: the sqlite3 module's own implicit BEGIN
    # is always deferred and commits before DDL, both wrong here.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {int(sqlite_busy_timeout_s() * 1000)}")
    cursor.execute("PRAGMA foreign_keys = ON")
    # Safe in WAL mode: a crash may lose the last commits, never corrupt.
    cursor.execute("PRAGMA synchronous = NORMAL")
    cursor.close()


def _sqlite_on_begin(connection: Connection) -> None:
    if connection.get_execution_options().get(_WRITE_OPTION):
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    else:
        connection.exec_driver_sql("BEGIN")


def enable_wal(engine: Engine) -> None:
    """Switch a SQLite ledger to WAL (persistent in the file; a no-op if already).

    The switch needs the file to itself, and SQLite may answer "database is locked" at once,
    without waiting out the busy timeout, while another process that opens the same fresh
    ledger holds a lock (eight workers starting on a new file did): it is tried again with
    jittered backoff for up to the busy timeout, re-reading the mode each time (another
    process may have switched it meanwhile)."""
    if engine.dialect.name != "sqlite" or sqlite_path(engine.url) is None:
        return
    deadline = time.monotonic() + sqlite_busy_timeout_s()
    pause = 0.01
    with engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        while True:
            try:
                mode = raw.execute("PRAGMA journal_mode").fetchone()[0]
                if mode.lower() != "wal":
                    raw.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() > deadline:
                    raise
            time.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 2, 0.5)


@contextmanager
def write_connection(engine: Engine) -> Iterator[Connection]:
    """A connection whose transactions take the write lock at BEGIN (SQLite)."""
    with engine.connect().execution_options(**{_WRITE_OPTION: True}) as conn:
        yield conn


@dataclass(frozen=True)
class Done(Generic[_T]):
    """A settled check's answer: the write had taken effect, and this is what it returned."""

    value: _T


Settled = Callable[[Connection], "Done[_T] | None"]


def run_in_transaction(
    engine: Engine, work: Callable[[Connection], _T], *, write: bool, what: str,
    settled: Settled[_T] | None = None, unsure: bool = False,
) -> _T:
    """Run ``work`` in one transaction, retrying races a bounded number of times.

    PostgreSQL serialization failures and deadlocks are normal outcomes under
    concurrency: they get a few jittered retries. ``work`` must therefore be safe to repeat (it
    is: the transaction rolled back). A SQLite lock held past the busy timeout is waited out
    again only on a :func:`patient` engine (a run's process). Everything else is translated
    once.

    One attempt may have committed although it failed: the connection was lost while its
    COMMIT was on the wire (an outage ridden out, docs/runs.md). The next attempt then asks
    ``settled`` first, in its own transaction: a :class:`Done` means the write is in the
    database already and is not done twice (a claim, a run's end, an event); without
    ``settled`` the write must be one that repeats harmlessly (a heartbeat). ``unsure``: an
    earlier call's attempt may have committed it (a record that waited through an outage), so
    the first attempt asks ``settled`` too.
    """
    retries = Retries(engine)
    while True:
        committing = False
        try:
            with write_connection(engine) if write else engine.connect() as conn:
                with conn.begin():
                    if retries.outage.waited:  # connected again: the ledger is back
                        came_back()
                    else:  # (an outage another transaction of this process met is over)
                        answered()
                    if unsure and settled is not None:
                        done = settled(conn)
                        if done is not None:
                            return done.value
                    result = work(conn)
                    committing = True
                return result
        except exc.DBAPIError as error:
            unsure = unsure or committing
            if not retries.again(error):
                raise translate_error(error, engine.url, what) from error


class Retries:
    """One transaction's retry budget (:func:`run_in_transaction`, the metric writer's flush):
    PostgreSQL races get up to ``MAX_ATTEMPTS`` jittered attempts; a SQLite lock held past
    the busy timeout is waited out again only on a :func:`patient` engine; an outage (a lost
    connection, a server that does not answer) is ridden out on a riding-out engine
    (:mod:`campaign.ledger.outage`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.attempt, self.locked = engine, 1, 0
        self.outage = Backoff(engine)

    def again(self, error: exc.DBAPIError) -> bool:
        """Whether to try once more after ``error`` (sleeping first for a race)."""
        if self.attempt < MAX_ATTEMPTS and is_retryable(error):
            time.sleep(random.uniform(0.01, 0.05) * self.attempt)
            self.attempt += 1
            return True
        if is_locked(error):  # the busy timeout has waited already: no sleep of our own
            self.locked += 1
            return self.locked < lock_attempts(self.engine)
        if is_outage(error, self.engine.dialect.name):
            return self.outage.wait()
        return False


def patient(engine: Engine, attempts: int = RUN_LOCK_ATTEMPTS) -> Engine:
    """``engine`` whose writes wait out ``attempts`` SQLite busy timeouts in a row and ride out
    an outage (a run's process; a command the user waits on gives up after one)."""
    return riding_out(engine.execution_options(**{_LOCK_ATTEMPTS_OPTION: attempts}))


def lock_attempts(engine: Engine) -> int:
    return int(engine.get_execution_options().get(_LOCK_ATTEMPTS_OPTION, 1))


def is_locked(error: exc.DBAPIError) -> bool:
    """SQLite's "database is locked" after its busy timeout."""
    return "database is locked" in str(error.orig or error)


def is_retryable(error: exc.DBAPIError) -> bool:
    """PostgreSQL serialization failures and deadlocks are worth another attempt.

    SQLite's "database is locked" is not: write transactions begin IMMEDIATE,
    so it only surfaces after the busy timeout has already waited for the
    lock (``sqlite_busy_timeout_s``), and retrying would multiply that wait.
    """
    return getattr(error.orig, "sqlstate", None) in _RETRYABLE_SQLSTATES


def is_driver_error(error: BaseException) -> bool:
    """An error the drivers raise themselves (a raw cursor's), not SQLAlchemy's."""
    return type(error).__module__.startswith(("sqlite3", "psycopg"))


def wrapped_driver_error(engine: Engine, error: Exception, statement: str) -> exc.DBAPIError:
    """A driver error as SQLAlchemy would wrap it: its class (OperationalError for a server
    that went away) and whether it lost the connection, so :class:`Retries` and
    :func:`translate_error` read it as they read SQLAlchemy's own."""
    dialect = engine.dialect
    lost = dialect.is_disconnect(error, None, None)  # type: ignore[arg-type]
    return exc.DBAPIError.instance(statement, None, error, dialect.loaded_dbapi.Error,
                                   connection_invalidated=lost, dialect=dialect)


def translate_error(error: exc.DBAPIError, url: URL, what: str) -> LedgerError:
    """Turn a driver error into one clear line of the ledger's own kind."""
    message = str(error.orig).strip().splitlines()[0] if error.orig else str(error)
    where = safe_url(url)
    if REFUSAL_PREFIX in message:
        return RefusedWrite(f"{what}: {message[message.index(REFUSAL_PREFIX) :]}")
    if isinstance(error, exc.IntegrityError):
        return RefusedWrite(f"{what}: {REFUSAL_PREFIX}: {message}")
    if "file is not a database" in message:
        return NotALedger(f"{where} is not a campaign ledger: the file is not a SQLite database")
    if "malformed" in message or "database corruption" in message:
        return LedgerError(f"ledger {where} is corrupted ({message}) while {what}: see "
                           "`campaign doctor`; restore it from a copy or an archive")
    if any(sign in message for sign in CANNOT_WRITE_SIGNS):  # file_state finds out which
        cause = why_unwritable(sqlite_path(url))
        if cause is not None or "disk I/O error" not in message:
            return LedgerUnwritable(f"ledger {where} cannot take writes while {what}: "
                                    f"{cause or message}")
    if "database is locked" in message:
        return LedgerUnreachable(
            f"ledger {where} stayed locked by another writer for over "
            f"{sqlite_busy_timeout_s():.0f} s while {what}"
        )
    # An outage as the retries judged it (a psycopg connection confused by a pooler's restart
    # is an InternalError, not an OperationalError): the same words once their patience ends.
    if (error.connection_invalidated or isinstance(error, exc.OperationalError)
            or is_outage(error, url.get_backend_name())):
        return LedgerUnreachable(f"ledger {where} unreachable while {what}: {message}")
    return LedgerError(f"ledger {where} error while {what}: {message}")


@contextmanager
def translated(url: URL, what: str) -> Iterator[None]:
    """Translate driver errors raised inside the block (for reads and setup)."""
    try:
        yield
    except exc.DBAPIError as error:
        raise translate_error(error, url, what) from error
    except sqlite3.Error as error:  # raw driver cursors (the frame reads) raise their own
        raise translate_error(exc.DBAPIError(None, None, error), url, what) from error
