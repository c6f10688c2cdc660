"""Reading the ledger: frozen records of one campaign or run, and DataFrames for notebooks.

:class:`LedgerReader` is the read half of :class:`~campaign.ledger.store.Ledger`
(which adds the writes): whatever only looks at a ledger (reports, the
progress display, a dashboard) needs nothing more. Frames are read on the
driver connection straight into pandas (:mod:`.frames`); records are plain
frozen values, never live ORM rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection, Engine, select

from campaign.errors import LedgerInputError, NoLedger, NotFound
from campaign.ledger import frames, migrate, reach_probe
from campaign.ledger.closing import Closing
from campaign.ledger.connections import (
    create_ledger_engine,
    parse_url,
    run_in_transaction,
    safe_url,
    sqlite_path,
)
from campaign.ledger.leases import database_now
from campaign.ledger.live import LiveReads
from campaign.ledger.location import resolve_url
from campaign.ledger.models import Campaign, Run, Variant
from campaign.ledger.records import (
    CampaignRecord,
    RunRecord,
    as_utc,
    campaign_record,
    run_record,
)
from campaign.ledger.vocabulary import RUN_STATUSES

if TYPE_CHECKING:
    import pandas as pd

_T = TypeVar("_T")
campaigns_t = Campaign.__table__
variants_t = Variant.__table__
runs_t = Run.__table__

_RUN_COLUMNS = (
    "r.id AS run_id, c.name AS campaign, v.name AS variant, v.is_control, r.seed, r.status, "
    "r.stop_cause, r.stop_step, r.stop_phase, r.stop_detail, r.relaunch_of, r.relaunch_reason, "
    "r.duplicate_of, "
    "r.config_sha256, r.config, r.environment, r.worker, r.created_at, r.started_at, "
    "r.ended_at, r.heartbeat_at"
)


class LedgerReader(LiveReads, Closing):
    """Reads of a campaign ledger on SQLite or PostgreSQL (see :class:`Ledger` to open one)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # Campaign names map to ids forever (no rename, no delete: triggers),
        # so the lookup can be remembered for the life of this object.
        self._campaign_ids: dict[str, int] = {}

    @classmethod
    def open(cls, url: str | None = None) -> LedgerReader:
        """Open the ledger at ``url`` (as :meth:`Ledger.open` resolves it) for reading only:
        the database refuses writes on these connections, and nothing is ever created."""
        parsed = parse_url(resolve_url(url))
        path = sqlite_path(parsed)
        if path is not None and not path.exists():
            raise NoLedger(f"no ledger at {path}")
        engine = create_ledger_engine(parsed, read_only=True)
        try:
            migrate.ensure_ready(engine, create=False)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine)

    @property
    def url(self) -> str:
        """The ledger URL without its password."""
        return safe_url(self.engine.url)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def revision(self) -> str | None:
        return migrate.current_revision(self.engine)

    def close(self) -> None:
        reach_probe.forget(self.engine)  # nobody is left to ask for
        self.engine.dispose()

    def _read(self, work: Callable[[Connection], _T], what: str) -> _T:
        return run_in_transaction(self.engine, work, write=False, what=what)

    def campaign(self, name: str) -> CampaignRecord:
        """The campaign called ``name``; :class:`NotFound` names the ledger otherwise."""

        def work(conn: Connection) -> CampaignRecord:
            campaign_id = self._campaign_id(conn, name)
            run_ids = conn.execute(
                select(runs_t.c.id).where(runs_t.c.campaign_id == campaign_id).order_by(runs_t.c.id)
            ).scalars()
            return campaign_by_id(conn, campaign_id, tuple(run_ids))

        return self._read(work, f"reading campaign {name!r}")

    def run(self, run_id: str) -> RunRecord:
        """One run as a frozen record."""

        def work(conn: Connection) -> RunRecord:
            if "\x00" in run_id:  # no id holds NUL (PostgreSQL refuses it in any text value)
                raise NotFound(f"no run {run_id!r} in ledger {self.url}")
            row = conn.execute(
                select(runs_t, campaigns_t.c.name.label("campaign_name"),
                       variants_t.c.name.label("variant_name"))
                .join(campaigns_t, campaigns_t.c.id == runs_t.c.campaign_id)
                .join(variants_t, variants_t.c.id == runs_t.c.variant_id)
                .where(runs_t.c.id == run_id)
            ).first()
            if row is None:
                raise NotFound(f"no run {run_id!r} in ledger {self.url}")
            return run_record(row._mapping)

        return self._read(work, f"reading run {run_id}")

    def campaigns(self) -> pd.DataFrame:
        return frames.query_frame(
            self.engine,
            "SELECT c.id, c.name, c.question, c.task, c.spec_sha256, c.created_at, "
            "COUNT(r.id) AS runs FROM campaigns c LEFT JOIN runs r ON r.campaign_id = c.id "
            "GROUP BY c.id, c.name, c.question, c.task, c.spec_sha256, c.created_at ORDER BY c.id",
            what="reading campaigns",
        )

    def runs(self, campaign: str, status: str | Sequence[str] | None = None) -> pd.DataFrame:
        """One row per run of ``campaign`` (config and environment decoded to dicts)."""
        query, params = self._runs_query(campaign, status)
        return frames.query_frame(self.engine, query, params, f"reading runs of {campaign!r}")

    def _runs_query(
        self, campaign: str, status: str | Sequence[str] | None
    ) -> tuple[str, list[Any]]:
        campaign_id = self._read(lambda c: self._campaign_id(c, campaign), "reading runs")
        query = (
            f"SELECT {_RUN_COLUMNS} FROM runs r JOIN campaigns c ON c.id = r.campaign_id "
            "JOIN variants v ON v.id = r.variant_id WHERE r.campaign_id = ?"
        )
        params: list[Any] = [campaign_id]
        if status is not None:
            statuses = [status] if isinstance(status, str) else list(status)
            unknown = sorted(set(statuses) - set(RUN_STATUSES))
            if unknown:
                raise LedgerInputError(
                    f"unknown run status {unknown[0]!r}: expected one of {', '.join(RUN_STATUSES)}"
                )
            query += f" AND r.status IN {frames.in_list(statuses)}"
            params += statuses
        return query + " ORDER BY r.id", params

    def run_rows(
        self, campaign: str, status: str | Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        """:meth:`runs` as plain dicts, without pandas (what a listing prints at once)."""
        query, params = self._runs_query(campaign, status)
        return frames.query_rows(self.engine, query, params, f"reading runs of {campaign!r}")

    def metrics(
        self,
        campaign: str | None = None,
        *,
        keys: Sequence[str] | None = None,
        runs: Sequence[str] | None = None,
        all_segments: bool = False,
    ) -> pd.DataFrame:
        """Metric points as a long frame (run_id, segment_id, key, step, value, examples_seen,
        wall_time).

        Select by ``campaign`` and/or explicit ``runs``; ``keys`` filters. By
        default, where a resumed segment replayed steps, the latest segment's
        value is kept (``all_segments=True`` returns both).
        """
        if campaign is None and runs is None:
            raise LedgerInputError("metrics needs a campaign or a list of run ids")
        query = (
            "SELECT m.run_id, m.segment_id, m.key, m.step, m.value, m.examples_seen, "
            "m.wall_time FROM metrics m"
        )
        clauses, params = [], []
        if campaign is not None:
            campaign_id = self._read(lambda c: self._campaign_id(c, campaign), "reading metrics")
            clauses.append("m.run_id IN (SELECT id FROM runs WHERE campaign_id = ?)")
            params.append(campaign_id)
        if runs is not None:
            clauses.append(f"m.run_id IN {frames.in_list(runs)}")
            params += list(runs)
        if keys is not None:
            clauses.append(f"m.key IN {frames.in_list(keys)}")
            params += list(keys)
        query += (
            " WHERE " + " AND ".join(clauses) + " ORDER BY m.run_id, m.key, m.step, m.segment_id"
        )
        frame = frames.query_frame(self.engine, query, params, "reading metrics")
        return frame if all_segments else frames.latest_segment_only(frame)

    def comparison(self, campaign: str, keys: Sequence[str] | None = None) -> pd.DataFrame:
        """One row per run: variant, seed, status, flattened config and latest metric values.

        "Latest" is the value at the highest step, from the newest segment when
        a resume replayed it: one index lookup per run and key in a single
        query, not a cache table.
        """
        campaign_id = self._read(lambda c: self._campaign_id(c, campaign), "reading runs")
        if keys is None:
            keys = self._metric_keys(campaign_id)
        latest = "".join(
            f", (SELECT m.value FROM metrics m WHERE m.run_id = r.id AND m.key = ? "
            f"ORDER BY m.step DESC, m.segment_id DESC LIMIT 1) AS latest_{i}"
            for i in range(len(keys))
        )
        table = frames.query_frame(
            self.engine,
            "SELECT r.id AS run_id, v.name AS variant, v.is_control, r.seed, r.status, "
            f"r.stop_cause, r.stop_step, r.config{latest} FROM runs r "
            "JOIN variants v ON v.id = r.variant_id WHERE r.campaign_id = ? ORDER BY r.id",
            [*keys, campaign_id],
            f"reading the comparison of {campaign!r}",
        )
        table = table.rename(columns={f"latest_{i}": key for i, key in enumerate(keys)})
        import pandas as pd

        config = frames.flatten_config(table.pop("config"))
        return pd.concat([table, config], axis=1)

    def _metric_keys(self, campaign_id: int) -> list[str]:
        """Distinct metric keys of a campaign by a skip scan of the (run, key) index.

        A plain DISTINCT reads every point; the recursive query jumps from key
        to key inside each run (a few index seeks per run).
        """
        frame = frames.query_frame(
            self.engine,
            "WITH RECURSIVE k(run_id, key) AS ("
            " SELECT r.id, (SELECT MIN(m.key) FROM metrics m WHERE m.run_id = r.id)"
            " FROM runs r WHERE r.campaign_id = ?"
            " UNION ALL"
            " SELECT k.run_id, (SELECT MIN(m.key) FROM metrics m"
            "  WHERE m.run_id = k.run_id AND m.key > k.key)"
            " FROM k WHERE k.key IS NOT NULL)"
            " SELECT DISTINCT key FROM k WHERE key IS NOT NULL ORDER BY key",
            [campaign_id],
            "reading metric keys",
        )
        return frame["key"].tolist()

    def latest_steps(self, run_ids: Sequence[str], key: str = "train/loss") -> dict[str, int]:
        """The highest step logged under ``key`` for each run (one index seek per run)."""
        if not run_ids:
            return {}
        rows = frames.query_rows(
            self.engine,
            "SELECT r.id AS run_id, (SELECT MAX(m.step) FROM metrics m WHERE m.run_id = r.id "
            f"AND m.key = ?) AS step FROM runs r WHERE r.id IN {frames.in_list(run_ids)}",
            [key, *run_ids],
            "reading progress",
        )
        return {str(row["run_id"]): int(row["step"]) for row in rows if row["step"] is not None}

    def progress_rows(self, campaign: str) -> tuple[datetime, list[dict[str, Any]]]:
        """The database's clock and one plain row per run (no DataFrame): what a progress
        display polls every second, so it stays a single cheap query."""

        def work(conn: Connection) -> tuple[datetime, list[dict[str, Any]]]:
            campaign_id = self._campaign_id(conn, campaign)
            now = database_now(conn)
            rows = conn.execute(
                select(runs_t.c.id, variants_t.c.name.label("variant"), runs_t.c.seed,
                       runs_t.c.status, runs_t.c.worker, runs_t.c.stop_step,
                       runs_t.c.stop_detail, runs_t.c.config,
                       runs_t.c.started_at, runs_t.c.ended_at, runs_t.c.heartbeat_at,
                       runs_t.c.relaunch_of)
                .join(variants_t, variants_t.c.id == runs_t.c.variant_id)
                .where(runs_t.c.campaign_id == campaign_id)
                .order_by(runs_t.c.id)
            ).all()
            return now, [dict(row._mapping) for row in rows]

        now, rows = self._read(work, f"reading the progress of {campaign!r}")
        for row in rows:
            for column in ("started_at", "ended_at", "heartbeat_at"):
                row[column] = as_utc(row[column])
        return as_utc(now).astimezone(UTC), rows

    def database_now(self) -> datetime:
        """The database's clock (UTC): the one that stamps heartbeats."""
        now = self._read(database_now, "reading the database's clock")
        return as_utc(now).astimezone(UTC)

    def events(self, campaign: str, run_id: str | None = None) -> pd.DataFrame:
        query = "SELECT id, run_id, at, kind, detail FROM events WHERE campaign_id = ?"
        extra: list[Any] = []
        if run_id is not None:
            query += " AND run_id = ?"
            extra.append(run_id)
        return self._campaign_frame(campaign, query + " ORDER BY id", "events", extra)

    def notes(self, campaign: str) -> pd.DataFrame:
        return self._campaign_frame(
            campaign, "SELECT id, at, text FROM notes WHERE campaign_id = ? ORDER BY id", "notes"
        )

    def segments(self, campaign: str) -> pd.DataFrame:
        return self._campaign_frame(
            campaign,
            "SELECT s.id AS segment_id, s.run_id, s.ordinal, s.start_step, s.end_step, s.worker, "
            "s.started_at, s.ended_at, s.resumed_from, s.training_s FROM segments s JOIN runs r "
            "ON r.id = s.run_id WHERE r.campaign_id = ? ORDER BY s.run_id, s.ordinal",
            "segments",
        )

    def artifacts(self, campaign: str) -> pd.DataFrame:
        return self._campaign_frame(
            campaign,
            "SELECT a.id, a.run_id, a.kind, a.path, a.sha256, a.bytes, a.step, a.created_at "
            "FROM artifacts a JOIN runs r ON r.id = a.run_id WHERE r.campaign_id = ? "
            "ORDER BY a.id",
            "artifacts",
        )

    def pilots(self, campaign: str) -> pd.DataFrame:
        """The campaign's pilots, newest last: verdict, frozen hash, software stack."""
        return self._campaign_frame(
            campaign,
            "SELECT id AS pilot_id, config_sha256, verdict, environment, created_at, gate_class "
            "FROM pilots "
            "WHERE campaign_id = ? ORDER BY id",
            "pilots",
        )

    def phases(self, campaign: str) -> pd.DataFrame:
        """Phase measurements of the campaign's runs and pilots (one row per phase and device)."""
        return self._campaign_frame(
            campaign,
            "SELECT p.* FROM phase_measurements p LEFT JOIN runs r ON r.id = p.run_id "
            "LEFT JOIN pilots pl ON pl.id = p.pilot_id "
            "WHERE (r.campaign_id = ? OR pl.campaign_id = ?) ORDER BY p.id",
            "phase measurements",
            placeholders=2,
        )

    def _campaign_frame(
        self, campaign: str, query: str, what: str, extra: Sequence[Any] = (), placeholders: int = 1
    ) -> pd.DataFrame:
        """Run ``query`` with the campaign's id bound to its first ``placeholders`` markers."""
        campaign_id = self._read(lambda c: self._campaign_id(c, campaign), f"reading {what}")
        params = [campaign_id] * placeholders + list(extra)
        return frames.query_frame(self.engine, query, params, f"reading {what} of {campaign!r}")

    def _campaign_id(self, conn: Connection, name: str) -> int:
        if name in self._campaign_ids:
            return self._campaign_ids[name]
        if "\x00" in name:  # no name holds NUL (PostgreSQL refuses it in any text value)
            raise NotFound(f"no campaign named {name!r} in ledger {self.url}")
        campaign_id = conn.execute(
            select(campaigns_t.c.id).where(campaigns_t.c.name == name)
        ).scalar()
        if campaign_id is None:
            raise NotFound(f"no campaign named {name!r} in ledger {self.url}")
        self._campaign_ids[name] = int(campaign_id)
        return int(campaign_id)


def campaign_by_id(conn: Connection, campaign_id: int, run_ids: tuple[str, ...]) -> CampaignRecord:
    row = conn.execute(select(campaigns_t).where(campaigns_t.c.id == campaign_id)).one()
    return campaign_record(row._mapping, run_ids)
