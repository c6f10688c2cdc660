"""The SQL that differs between SQLite and PostgreSQL, in one place.

Business code never branches on the database; it uses these constructs.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import DateTime
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement


class utcnow(FunctionElement[Any]):
    """The database's current UTC time, with sub-second resolution.

    Time comes from the database, not from client clocks (heartbeats from
    several machines must be comparable). SQLite's ``CURRENT_TIMESTAMP`` has
    one-second resolution, so it gets ``strftime`` with milliseconds instead.
    """

    type = DateTime(timezone=True)
    inherit_cache = True


@compiles(utcnow, "postgresql")
def _utcnow_postgresql(element: utcnow, compiler: Any, **kw: Any) -> str:
    return "statement_timestamp()"


@compiles(utcnow, "sqlite")
def _utcnow_sqlite(element: utcnow, compiler: Any, **kw: Any) -> str:
    return "(strftime('%Y-%m-%d %H:%M:%f', 'now'))"


@compiles(utcnow)
def _utcnow_default(element: utcnow, compiler: Any, **kw: Any) -> str:
    return "CURRENT_TIMESTAMP"


def share_lock(dialect_name: str, table_alias: str) -> str:
    """The suffix that share-locks the checked row: PostgreSQL ``FOR SHARE OF``; SQLite's
    writing transaction already holds the database's only write lock."""
    return f" FOR SHARE OF {table_alias}" if dialect_name == "postgresql" else ""


def metric_insert_sql(dialect_name: str) -> str:
    """The driver-level statement for one metric row, idempotent on its key.

    Written for the driver (positional parameters, executemany) because that is
    what keeps ingest at raw-driver speed: SQLAlchemy's compiled insert of
    dicts reaches under half of it. ``ON CONFLICT DO NOTHING`` makes a retried
    flush of the same (segment, key, step) harmless on both engines.
    """
    values = ", ".join([placeholder(dialect_name)] * 7)
    return f"INSERT INTO metrics ({_METRIC_COLUMNS}) VALUES ({values}) ON CONFLICT DO NOTHING"


_METRIC_COLUMNS = "run_id, segment_id, key, step, value, examples_seen, wall_time"
_UNIQUE_VIOLATION = "23505"
# Below this a COPY's extra round trips (savepoint, copy, release) cost more
# than the rows it saves.
COPY_MIN_ROWS = 64


def insert_metric_rows(dialect_name: str, cursor: Any, rows: list[tuple[Any, ...]]) -> None:
    """Insert one batch of metric rows on a driver cursor, inside the caller's transaction.

    PostgreSQL, batches of ``COPY_MIN_ROWS`` or more: ``COPY`` (about 1.5x
    ``executemany``, benchmarks/ingest.py).
    COPY knows no ``ON CONFLICT``, so it is optimistic: if the batch repeats
    points already stored (a flush retried after an ambiguous commit), the
    savepoint is rolled back and the batch goes through the idempotent
    insert. SQLite: ``executemany`` of the idempotent insert.
    """
    if dialect_name == "postgresql" and len(rows) >= COPY_MIN_ROWS:
        cursor.execute("SAVEPOINT metric_batch")
        try:
            with cursor.copy(f"COPY metrics ({_METRIC_COLUMNS}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            cursor.execute("RELEASE SAVEPOINT metric_batch")
            return
        except Exception as error:
            if getattr(error, "sqlstate", None) != _UNIQUE_VIOLATION:
                raise
            cursor.execute("ROLLBACK TO SAVEPOINT metric_batch")
    cursor.executemany(metric_insert_sql(dialect_name), rows)


def metric_transaction_prelude(dialect_name: str, durable: bool = False) -> tuple[str, ...]:
    """Statements that open a metric batch's transaction on the driver connection.

    SQLite: take the write lock at BEGIN, so the batch queues on the busy
    timeout instead of failing on a lock upgrade. PostgreSQL: do not wait for
    the WAL flush of metric batches (``synchronous_commit = off`` for this
    transaction only): a server crash may lose the last fraction of a second
    of points, never corrupt, the same trade as SQLite's ``synchronous =
    NORMAL`` in WAL mode; run lifecycle writes stay fully durable.

    ``durable`` (a writer's last transaction): a synchronous COMMIT that waits for the log to
    be on disk past every earlier batch; the transaction takes an id so that it has a commit
    to wait for even when it inserts nothing.
    """
    if dialect_name == "sqlite":
        return ("BEGIN IMMEDIATE",)
    if durable:
        return ("SET LOCAL synchronous_commit = on", "SELECT txid_current()")
    return ("SET LOCAL synchronous_commit = off",)


def placeholder(dialect_name: str) -> str:
    """The DB-API parameter marker of the driver behind ``dialect_name``."""
    return "?" if dialect_name == "sqlite" else "%s"


def server_started_at(conn: Any) -> Any:
    """When the database server last started (PostgreSQL), None where there is no server
    (SQLite): a heartbeat is never judged stale across a restart (leases.py)."""
    if conn.dialect.name != "postgresql":
        return None
    from sqlalchemy import text

    return conn.execute(text("SELECT pg_postmaster_start_time()")).scalar_one()
