"""Reads that go straight to pandas (imported when the first frame is built).

Queries run on the driver connection (DB-API cursor, ``fetchall``, one
``DataFrame`` construction): going through a SQLAlchemy ``Connection`` costs
about twice as long for the large metric reads (benchmarks/read.py). SQL is
written once with ``?`` markers and adapted to the driver's style.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine

from campaign.ledger.connections import (
    is_driver_error,
    run_in_transaction,
    wrapped_driver_error,
)
from campaign.ledger.dialects import placeholder
from campaign.ledger.records import as_utc

if TYPE_CHECKING:
    import pandas as pd

TIME_COLUMNS = frozenset({"created_at", "started_at", "ended_at", "heartbeat_at", "at"})
JSON_COLUMNS = frozenset({"config", "environment", "overrides", "inputs"})
# Integer columns that may hold NULL: nullable Int64 instead of object dtype.
NULLABLE_INT_COLUMNS = frozenset(
    {"examples_seen", "stop_step", "end_step", "step", "resumed_from", "run_step"}
)


def query_rows(
    engine: Engine, sql: str, params: Sequence[Any] = (), what: str = "reading"
) -> list[dict[str, Any]]:
    """Run ``sql`` into plain dicts, without pandas, typed as :func:`query_frame` types them
    (JSON decoded, UTC datetimes, booleans): for listings a command prints at once, where
    importing pandas would cost more than the query."""
    sql = sql.replace("?", placeholder(engine.dialect.name))

    def fetch(conn: Connection) -> list[dict[str, Any]]:
        return [dict(row._mapping) for row in conn.exec_driver_sql(sql, tuple(params))]

    rows = run_in_transaction(engine, fetch, write=False, what=what)
    for row in rows:
        for column in JSON_COLUMNS.intersection(row):
            if isinstance(row[column], str):
                row[column] = json.loads(row[column])
        for column in TIME_COLUMNS.intersection(row):
            row[column] = _utc(row[column])
        if "is_control" in row:
            row["is_control"] = bool(row["is_control"])
    return rows


def _utc(value: Any) -> datetime | None:
    """A timestamp as an aware UTC datetime (SQLite hands back naive text, written in UTC)."""
    if value is None:
        return None
    moment = as_utc(datetime.fromisoformat(value) if isinstance(value, str) else value)
    return moment.astimezone(UTC) if moment is not None else None


def query_frame(
    engine: Engine, sql: str, params: Sequence[Any] = (), what: str = "reading"
) -> pd.DataFrame:
    """Run ``sql`` (``?`` markers) on the driver connection into a DataFrame."""
    import pandas as pd  # pandas only when a frame is built: commands start faster

    sql = sql.replace("?", placeholder(engine.dialect.name))

    def fetch(conn: Connection) -> tuple[list[Any], list[str]]:
        """On the driver's own cursor (pandas' fastest path); its errors wrapped as
        SQLAlchemy's, so a lost connection is ridden out like any read's (ledger/outage.py)."""
        cursor = conn.connection.driver_connection.cursor()
        try:
            cursor.execute(sql, tuple(params))
            return cursor.fetchall(), [d[0] for d in cursor.description]
        except Exception as error:
            if is_driver_error(error):
                raise wrapped_driver_error(engine, error, sql) from error
            raise
        finally:
            with contextlib.suppress(Exception):
                cursor.close()

    rows, columns = run_in_transaction(engine, fetch, write=False, what=what)
    frame = pd.DataFrame.from_records(rows, columns=columns, coerce_float=False)
    return _normalise(frame)


def _normalise(frame: pd.DataFrame) -> pd.DataFrame:
    """Same dtypes on both engines: UTC timestamps, decoded JSON documents."""
    import pandas as pd  # pandas only when a frame is built: commands start faster

    for column in frame.columns:
        if column in TIME_COLUMNS:
            frame[column] = pd.to_datetime(frame[column], utc=True, format="ISO8601")
        elif column in JSON_COLUMNS:
            # pandas may hold a missing document as None or NaN: only text is JSON
            frame[column] = [json.loads(v) if isinstance(v, str) else None for v in frame[column]]
        elif column in NULLABLE_INT_COLUMNS and frame[column].dtype == object:
            frame[column] = frame[column].astype("Int64")
        elif column == "is_control":
            frame[column] = frame[column].astype(bool)
    return frame


def in_list(values: Sequence[Any]) -> str:
    """``(?, ?, ...)`` for an IN clause of ``len(values)`` parameters."""
    return "(" + ", ".join("?" * len(values)) + ")"


def latest_segment_only(frame: pd.DataFrame) -> pd.DataFrame:
    """Keep, for every (run, key, step), the value of the latest segment.

    A resumed segment re-executes the steps after its checkpoint; both values
    stay in the ledger, and readers take the newest by default. Only runs
    with several segments need the work.
    """
    import pandas as pd  # pandas only when a frame is built: commands start faster

    if frame.empty:
        return frame
    multi = frame.groupby("run_id", sort=False)["segment_id"].nunique()
    resumed = multi.index[multi > 1]
    if len(resumed) == 0:
        return frame
    mask = frame["run_id"].isin(resumed)
    part = frame[mask].sort_values(["run_id", "key", "step", "segment_id"])
    part = part.drop_duplicates(["run_id", "key", "step"], keep="last")
    merged = pd.concat([frame[~mask], part])
    return merged.sort_values(["run_id", "key", "step"], kind="stable").reset_index(drop=True)


def flatten_config(configs: pd.Series) -> pd.DataFrame:
    """One column per dotted config key (``config.optimizer.lr``) for comparisons."""
    import pandas as pd  # pandas only when a frame is built: commands start faster

    flat = pd.json_normalize(list(configs), sep=".")
    flat.columns = [f"config.{c}" for c in flat.columns]
    flat.index = configs.index
    return flat
