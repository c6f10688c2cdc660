"""Reads for watching a ledger while it is written: cheap, indexed, and only what is new.

A dashboard polls these every second or two, so each stays a handful of
index lookups whatever the size of the campaign: the runs of one campaign
(index on ``campaign_id``), the latest segment of the runs still open
(unique ``(run_id, ordinal)``), and the metric points after a per-run step
(the metrics' primary key starts with ``(run_id, key, step)``). No
DataFrame, no JSON parsing of configs on the hot path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection, Engine

from campaign.ledger import frames
from campaign.ledger.leases import database_now
from campaign.ledger.records import as_utc

_T = TypeVar("_T")

_LIVE_RUNS = (
    "SELECT r.id, v.name AS variant, v.is_control, r.seed, r.status, r.relaunch_of, "
    "r.stop_cause, r.stop_step, r.worker, r.started_at, r.ended_at, r.heartbeat_at "
    "FROM runs r JOIN variants v ON v.id = r.variant_id WHERE r.campaign_id = ? ORDER BY r.id"
)


class _Reader(Protocol):
    engine: Engine

    def _read(self, work: Callable[[Connection], _T], what: str) -> _T: ...
    def _campaign_id(self, conn: Connection, name: str) -> int: ...
    def _metric_keys(self, campaign_id: int) -> list[str]: ...


class LiveReads:
    """The watching half of :class:`~campaign.ledger.reads.LedgerReader`."""

    def campaign_overview(self: _Reader) -> list[dict[str, Any]]:
        """One row per campaign: name, question, task, run counts by status and the last
        activity (the newest start, end or heartbeat of any of its runs)."""
        rows = frames.query_rows(
            self.engine,
            "SELECT c.name, c.question, c.task, c.created_at, r.status, COUNT(r.id) AS n, "
            "MAX(r.heartbeat_at) AS heartbeat_at, MAX(r.ended_at) AS ended_at, "
            "MAX(r.started_at) AS started_at FROM campaigns c "
            "LEFT JOIN runs r ON r.campaign_id = c.id "
            "GROUP BY c.id, c.name, c.question, c.task, c.created_at, r.status ORDER BY c.id",
            [],
            "reading the campaigns",
        )
        overview: dict[str, dict[str, Any]] = {}
        for row in rows:
            entry = overview.setdefault(row["name"], {
                "name": row["name"], "question": row["question"], "task": row["task"],
                "counts": {}, "runs": 0, "last_activity": row["created_at"],
            })
            if row["status"] is not None:
                entry["counts"][row["status"]] = int(row["n"])
                entry["runs"] += int(row["n"])
            for moment in (row["heartbeat_at"], row["ended_at"], row["started_at"]):
                if moment is not None and moment > entry["last_activity"]:
                    entry["last_activity"] = moment
        return list(overview.values())

    def live_runs(self: _Reader, campaign: str) -> tuple[datetime, list[dict[str, Any]]]:
        """The database's clock (read after the rows), and one lean row per run (no config)."""
        campaign_id = self._read(lambda c: self._campaign_id(c, campaign), "reading runs")
        rows = frames.query_rows(self.engine, _LIVE_RUNS, [campaign_id],
                                 f"reading the runs of {campaign!r}")
        # The clock after the rows: every start or end committed before the read is older.
        now = as_utc(self._read(database_now, "reading the database's clock"))
        return now.astimezone(UTC), rows

    def metric_keys(self: _Reader, campaign: str, run_id: str | None = None) -> list[str]:
        """The metric keys logged in ``campaign`` (or by one run), sorted: a skip scan of the
        metrics' (run, key) index, a few seeks per run, never a read of every point."""
        if run_id is None:
            campaign_id = self._read(lambda c: self._campaign_id(c, campaign), "reading keys")
            return self._metric_keys(campaign_id)
        rows = frames.query_rows(
            self.engine,
            "WITH RECURSIVE k(key) AS (SELECT MIN(key) FROM metrics WHERE run_id = ? UNION ALL "
            "SELECT (SELECT MIN(m.key) FROM metrics m WHERE m.run_id = ? AND m.key > k.key) "
            "FROM k WHERE k.key IS NOT NULL) SELECT key FROM k WHERE key IS NOT NULL",
            [run_id, run_id],
            f"reading the metric keys of run {run_id}",
        )
        return [str(row["key"]) for row in rows]

    def metric_totals(self: _Reader, campaign: str, key: str) -> dict[str, float]:
        """run id -> the sum of ``key`` over its points (its newest value per step), for the
        runs of ``campaign`` that logged it: one range of the metrics' key per run."""
        campaign_id = self._read(lambda c: self._campaign_id(c, campaign), "reading totals")
        rows = frames.query_rows(
            self.engine,
            "SELECT m.run_id, SUM(m.value) AS total FROM metrics m WHERE m.run_id IN "
            "(SELECT id FROM runs WHERE campaign_id = ?) AND m.key = ? AND NOT EXISTS ("
            "SELECT 1 FROM metrics n WHERE n.run_id = m.run_id AND n.key = m.key "
            "AND n.step = m.step AND n.segment_id > m.segment_id) GROUP BY m.run_id",
            [campaign_id, key],
            f"reading the totals of {key}",
        )
        return {str(r["run_id"]): float(r["total"]) for r in rows if r["total"] is not None}

    def planned_updates(self: _Reader, run_ids: Sequence[str]) -> dict[str, int]:
        """Each run's planned number of updates (``budget.updates`` of its frozen config:
        immutable, so a caller may keep the answer for the life of the run)."""
        if not run_ids:
            return {}
        rows = frames.query_rows(
            self.engine, f"SELECT id, config FROM runs WHERE id IN {frames.in_list(run_ids)}",
            list(run_ids), "reading run budgets",
        )
        return {
            str(row["id"]): int(row["config"].get("budget", {}).get("updates") or 0)
            for row in rows
        }

    def latest_segments(self: _Reader, run_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
        """run id -> (id, start step) of its newest segment, for runs that have one."""
        if not run_ids:
            return {}
        rows = frames.query_rows(
            self.engine,
            "SELECT s.run_id, s.id, s.start_step FROM segments s WHERE s.run_id IN "
            f"{frames.in_list(run_ids)} AND s.ordinal = (SELECT MAX(t.ordinal) FROM segments t "
            "WHERE t.run_id = s.run_id)",
            list(run_ids),
            "reading segments",
        )
        return {str(r["run_id"]): (int(r["id"]), int(r["start_step"])) for r in rows}

    def segment_starts_after(self: _Reader, seen: Mapping[str, int]) -> dict[str, int]:
        """run id -> the earliest start step of its segments newer than the one given (what a
        page that saw segment ``seen[run]`` must redraw from). Empty when nothing changed."""
        if not seen:
            return {}
        clauses = " OR ".join("(s.run_id = ? AND s.id > ?)" for _ in seen)
        params = [value for run, segment in seen.items() for value in (run, int(segment))]
        rows = frames.query_rows(
            self.engine,
            f"SELECT s.run_id, MIN(s.start_step) AS start_step FROM segments s WHERE {clauses} "
            "GROUP BY s.run_id",
            params,
            "reading segments",
        )
        return {str(r["run_id"]): int(r["start_step"]) for r in rows}

    def points_from(
        self: _Reader, starts: Mapping[str, int], keys: Sequence[str] | None = None
    ) -> list[tuple[str, str, int, int, float | None]]:
        """Metric points (run_id, key, step, segment_id, value) at or after a step per run,
        in (run, key, step, segment) order: one primary-key range per run and key."""
        if not starts:
            return []
        clauses, params = [], []
        for run_id, step in starts.items():
            if keys:
                clauses.append(f"(m.run_id = ? AND m.key IN {frames.in_list(keys)} "
                               "AND m.step >= ?)")
                params += [run_id, *keys, int(step)]
            else:
                clauses.append("(m.run_id = ? AND m.step >= ?)")
                params += [run_id, int(step)]
        rows = frames.query_rows(
            self.engine,
            "SELECT m.run_id, m.key, m.step, m.segment_id, m.value FROM metrics m WHERE "
            + " OR ".join(clauses)
            + " ORDER BY m.run_id, m.key, m.step, m.segment_id",
            params,
            "reading new metric points",
        )
        return [(r["run_id"], r["key"], int(r["step"]), int(r["segment_id"]), r["value"])
                for r in rows]
