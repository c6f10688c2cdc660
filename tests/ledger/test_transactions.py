"""Transaction discipline: lock waits instead of failures, bounded retries of real races."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from sqlalchemy import Connection, text

from campaign.ledger import Ledger, LedgerError
from campaign.ledger.connections import MAX_ATTEMPTS, run_in_transaction
from tests.support.helpers import plan_campaign


def test_sqlite_writer_waits_for_a_held_write_lock(sqlite_url: str) -> None:
    """Another process holding the write lock delays a write; it never fails it."""
    with Ledger.open(sqlite_url, create=True) as ledger:
        plan_campaign(ledger, seeds=1)
        holder = sqlite3.connect(
            sqlite_url.removeprefix("sqlite:///"), isolation_level=None, check_same_thread=False
        )
        holder.execute("BEGIN IMMEDIATE")
        release = threading.Timer(0.5, lambda: holder.execute("COMMIT"))
        release.start()
        start = time.perf_counter()
        ledger.add_note("digits-lr", "written after the lock was released")
        waited = time.perf_counter() - start
        release.join()
        holder.close()
        assert waited >= 0.4  # it queued on the busy timeout
        assert len(ledger.notes("digits-lr")) == 1


def test_sqlite_database_is_wal(sqlite_url: str) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger, ledger.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


@pytest.mark.parametrize("sqlstate", ["serialization_failure", "deadlock_detected"])
def test_postgresql_races_are_retried(postgresql_url: str, sqlstate: str) -> None:
    """A real serialization failure / deadlock error from the server: retried, then done."""
    with Ledger.open(postgresql_url, create=True) as ledger:
        attempts = []

        def work(conn: Connection) -> str:
            attempts.append(1)
            conn.execute(text("CREATE TABLE IF NOT EXISTS scratch (n integer)"))
            conn.execute(text("INSERT INTO scratch VALUES (1)"))
            if len(attempts) < 3:
                conn.execute(text(
                    f"DO $$ BEGIN RAISE EXCEPTION 'race' USING ERRCODE = '{sqlstate}'; END $$"
                ))
            return "done"

        assert run_in_transaction(ledger.engine, work, write=True, what="racing") == "done"
        assert len(attempts) == 3
        with ledger.engine.connect() as conn:  # the failed attempts left nothing behind
            assert conn.execute(text("SELECT COUNT(*) FROM scratch")).scalar() == 1


def test_postgresql_retries_are_bounded(postgresql_url: str) -> None:
    with Ledger.open(postgresql_url, create=True) as ledger:
        attempts = []

        def work(conn: Connection) -> None:
            attempts.append(1)
            conn.execute(text(
                "DO $$ BEGIN RAISE EXCEPTION 'always' USING ERRCODE = 'serialization_failure'; "
                "END $$"
            ))

        with pytest.raises(LedgerError, match="always"):
            run_in_transaction(ledger.engine, work, write=True, what="racing forever")
        assert len(attempts) == MAX_ATTEMPTS
