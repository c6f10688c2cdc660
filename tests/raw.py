"""Raw driver connections that go past the Ledger API, to prove the database itself refuses."""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg
from sqlalchemy.engine import make_url


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
