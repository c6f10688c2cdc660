"""Raw driver connections that go past the Ledger API, to prove the database itself refuses."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

REFUSAL_ERRORS = (sqlite3.IntegrityError, psycopg.errors.IntegrityError)


def raw_connect(url: str) -> Any:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return sqlite3.connect(parsed.database, timeout=60)
    return psycopg.connect(parsed.set(drivername="postgresql").render_as_string(False))


def placeholders(url: str, sql: str) -> str:
    return sql if url.startswith("sqlite") else sql.replace("?", "%s")


def execute(url: str, sql: str, params: tuple = ()) -> list[tuple]:
    """Run one statement in its own transaction on a raw connection; return its rows."""
    conn = raw_connect(url)
    try:
        cursor = conn.execute(placeholders(url, sql), params)
        rows = cursor.fetchall() if cursor.description else []
        conn.commit()
        return rows
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.close()


def refused(url: str, sql: str, params: tuple = (), *,
            unchanged: Callable[[str], Any] | None = None) -> str:
    """Run ``sql`` and expect the database to refuse it with the ledger's words; with
    ``unchanged``, also that what it reads of the ledger is the same before and after.
    Returns the message."""
    before = unchanged(url) if unchanged is not None else None
    with pytest.raises(REFUSAL_ERRORS) as caught:
        execute(url, sql, params)
    if unchanged is not None:
        assert unchanged(url) == before
    message = str(caught.value)
    assert "campaign ledger refused" in message
    return message
