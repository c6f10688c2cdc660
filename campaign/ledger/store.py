"""The Ledger: the one API through which commands, the loop and notebooks use the database.

Writes are short transactions (``BEGIN IMMEDIATE`` on SQLite) with bounded
retries on lock and serialization races; every status change writes its
``events`` row in the same transaction. Reads return pandas DataFrames or
frozen records, never live ORM rows. The database enforces immutability
itself (triggers in ``migrations/``); this class checks the same rules first
so that a mistake gets a precise message instead of a trigger's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import pandas as pd
from sqlalchemy import Connection, Engine, insert, select, update

from campaign.ledger import frames, migrate
from campaign.ledger import statements as sql
from campaign.ledger.canonical import canonical_json, sha256_text
from campaign.ledger.claims import claim_next_without_commit, start_without_commit
from campaign.ledger.closing import Closing
from campaign.ledger.dialects import utcnow
from campaign.ledger.engine import (
    create_ledger_engine,
    parse_url,
    resolve_url,
    run_in_transaction,
    safe_url,
)
from campaign.ledger.errors import IllegalTransition, LedgerInputError, NotFound
from campaign.ledger.ids import new_run_id
from campaign.ledger.leases import (
    LostRun,
    any_stale,
    database_now,
    hold_lease,
    mark_stale_lost_without_commit,
)
from campaign.ledger.metrics import MetricWriter
from campaign.ledger.models import (
    Artifact,
    Campaign,
    Event,
    Note,
    PhaseMeasurement,
    Pilot,
    Run,
    Segment,
    Variant,
)
from campaign.ledger.records import (
    CampaignRecord,
    Claim,
    NewRun,
    NewVariant,
    RunRecord,
    StopInfo,
    as_utc,
)
from campaign.ledger.vocabulary import (
    CAUSES_BY_STATUS,
    ENDED_STATUSES,
    RESUMABLE_STATUSES,
    RUN_STATUSES,
    RUNNING,
    TERMINAL_STATUSES,
    can_transition,
)

_T = TypeVar("_T")
campaigns_t = Campaign.__table__
variants_t = Variant.__table__
runs_t = Run.__table__
segments_t = Segment.__table__
events_t = Event.__table__
notes_t = Note.__table__
artifacts_t = Artifact.__table__
phases_t = PhaseMeasurement.__table__
pilots_t = Pilot.__table__

_RUN_COLUMNS = (
    "r.id AS run_id, c.name AS campaign, v.name AS variant, v.is_control, r.seed, r.status, "
    "r.stop_cause, r.stop_step, r.stop_phase, r.stop_detail, r.relaunch_of, r.relaunch_reason, "
    "r.config_sha256, r.config, r.environment, r.worker, r.created_at, r.started_at, "
    "r.ended_at, r.heartbeat_at"
)


class Ledger(Closing):
    """A campaign ledger on SQLite or PostgreSQL.

    Open with :meth:`open`; use as a context manager or call :meth:`close`.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # Campaign names map to ids forever (no rename, no delete: triggers),
        # so the lookup can be remembered for the life of this object.
        self._campaign_ids: dict[str, int] = {}

    # -- opening -----------------------------------------------------------------

    @classmethod
    def open(cls, url: str | None = None, *, create: bool = True, check: bool = True) -> Ledger:
        """Open the ledger at ``url`` (else ``CAMPAIGN_LEDGER``, else ``sqlite:///campaign.db``).

        A fresh, empty database is created at the head revision (``create``).
        A ledger at an older or unknown revision is refused (``check``) with a
        message naming ``campaign db upgrade``; nothing is written to it.
        """
        engine = create_ledger_engine(parse_url(resolve_url(url)))
        try:
            if check:
                migrate.ensure_ready(engine, create=create)
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
        self.engine.dispose()

    def _write(self, work: Callable[[Connection], _T], what: str) -> _T:
        return run_in_transaction(self.engine, work, write=True, what=what)

    def _read(self, work: Callable[[Connection], _T], what: str) -> _T:
        return run_in_transaction(self.engine, work, write=False, what=what)

    # -- campaigns, variants, runs ------------------------------------------------

    def create_campaign(
        self,
        name: str,
        *,
        question: str,
        task: str,
        spec: Mapping[str, Any] | str,
        variants: Sequence[NewVariant],
        runs: Sequence[NewRun],
    ) -> CampaignRecord:
        """Record a planned campaign, its variants and its runs in one transaction.

        ``spec`` is stored whole (canonical JSON unless given as text) with its
        SHA-256. Each run's config is frozen as canonical JSON and hashed.
        """
        spec_text = spec if isinstance(spec, str) else canonical_json(spec)
        _check_plan(name, variants, runs)
        run_rows = [
            {"id": new_run_id(), "variant": run.variant, "seed": run.seed,
             "config": canonical_json(run.config)}
            for run in runs
        ]  # fmt: skip

        def work(conn: Connection) -> CampaignRecord:
            campaign_id = conn.execute(
                insert(campaigns_t)
                .values(name=name, question=question, spec=spec_text,
                        spec_sha256=sha256_text(spec_text), task=task)
                .returning(campaigns_t.c.id)
            ).scalar_one()  # fmt: skip
            variant_ids = {}
            for variant in variants:
                variant_ids[variant.name] = conn.execute(
                    insert(variants_t)
                    .values(campaign_id=campaign_id, name=variant.name,
                            is_control=variant.is_control,
                            overrides=canonical_json(dict(variant.overrides)))
                    .returning(variants_t.c.id)
                ).scalar_one()  # fmt: skip
            if run_rows:
                conn.execute(
                    insert(runs_t),
                    [
                        {"id": r["id"], "campaign_id": campaign_id,
                         "variant_id": variant_ids[r["variant"]], "seed": r["seed"],
                         "config": r["config"], "config_sha256": sha256_text(r["config"])}
                        for r in run_rows
                    ],
                )  # fmt: skip
                conn.execute(
                    insert(events_t),
                    [
                        {"campaign_id": campaign_id, "run_id": r["id"], "kind": "planned",
                         "detail": f"variant {r['variant']}, seed {r['seed']}"}
                        for r in run_rows
                    ],
                )  # fmt: skip
            return _campaign_by_id(conn, campaign_id, tuple(r["id"] for r in run_rows))

        return self._write(work, f"recording campaign {name!r}")

    def campaign(self, name: str) -> CampaignRecord:
        """The campaign called ``name``; :class:`NotFound` names the ledger otherwise."""

        def work(conn: Connection) -> CampaignRecord:
            campaign_id = self._campaign_id(conn, name)
            run_ids = conn.execute(
                select(runs_t.c.id).where(runs_t.c.campaign_id == campaign_id).order_by(runs_t.c.id)
            ).scalars()
            return _campaign_by_id(conn, campaign_id, tuple(run_ids))

        return self._read(work, f"reading campaign {name!r}")

    def add_run(
        self,
        campaign: str,
        variant: str,
        seed: int,
        config: Mapping[str, Any],
        *,
        relaunch_of: str | None = None,
        reason: str | None = None,
    ) -> str:
        """Plan one more run; with ``relaunch_of`` it is a relaunch (reason required).

        The old run is never touched: it keeps its status forever, and gets a
        ``relaunched`` event pointing at the new id.
        """
        if relaunch_of is not None and not (reason and reason.strip()):
            raise LedgerInputError(f"relaunch of run {relaunch_of} needs a reason")
        config_text = canonical_json(config)
        run_id = new_run_id()

        def work(conn: Connection) -> str:
            campaign_id = self._campaign_id(conn, campaign)
            variant_id = conn.execute(
                sql.VARIANT_ID, {"p_campaign_id": campaign_id, "p_name": variant}
            ).scalar()
            if variant_id is None:
                raise NotFound(f"campaign {campaign!r} has no variant {variant!r}")
            if relaunch_of is not None:
                _run_campaign(conn, relaunch_of, campaign_id)
            conn.execute(
                sql.INSERT_RUN,
                {"id": run_id, "campaign_id": campaign_id, "variant_id": variant_id, "seed": seed,
                 "config": config_text, "config_sha256": sha256_text(config_text),
                 "relaunch_of": relaunch_of, "relaunch_reason": reason},
            )  # fmt: skip
            detail = f"variant {variant}, seed {seed}"
            if relaunch_of is not None:
                detail += f", relaunch of {relaunch_of}: {reason}"
                _event(conn, campaign_id, relaunch_of, "relaunched", f"as {run_id}: {reason}")
            _event(conn, campaign_id, run_id, "planned", detail)
            return run_id

        return self._write(work, f"planning a run of {campaign!r}")

    def run(self, run_id: str) -> RunRecord:
        """One run as a frozen record."""

        def work(conn: Connection) -> RunRecord:
            row = conn.execute(
                select(runs_t, campaigns_t.c.name.label("campaign_name"),
                       variants_t.c.name.label("variant_name"))
                .join(campaigns_t, campaigns_t.c.id == runs_t.c.campaign_id)
                .join(variants_t, variants_t.c.id == runs_t.c.variant_id)
                .where(runs_t.c.id == run_id)
            ).first()  # fmt: skip
            if row is None:
                raise NotFound(f"no run {run_id!r} in ledger {self.url}")
            m = row._mapping
            return RunRecord(
                id=m["id"], campaign_id=m["campaign_id"], campaign=m["campaign_name"],
                variant_id=m["variant_id"], variant=m["variant_name"], seed=m["seed"],
                config=m["config"], config_sha256=m["config_sha256"], status=m["status"],
                stop_cause=m["stop_cause"], stop_step=m["stop_step"],
                stop_phase=m["stop_phase"], stop_detail=m["stop_detail"],
                relaunch_of=m["relaunch_of"], relaunch_reason=m["relaunch_reason"],
                worker=m["worker"], created_at=as_utc(m["created_at"]),
                started_at=as_utc(m["started_at"]), ended_at=as_utc(m["ended_at"]),
                heartbeat_at=as_utc(m["heartbeat_at"]),
            )  # fmt: skip

        return self._read(work, f"reading run {run_id}")

    # -- lifecycle ------------------------------------------------------------------

    def claim_next(self, campaign: str, worker: str) -> Claim | None:
        """Atomically take the next planned run of ``campaign``; None when none is left."""

        def work(conn: Connection) -> Claim | None:
            return claim_next_without_commit(conn, self._campaign_id(conn, campaign), worker)

        return self._write(work, f"claiming a run of {campaign!r}")

    def start(
        self, run_id: str, worker: str, *, start_step: int = 0, resumed_from: int | None = None
    ) -> Claim:
        """Move one named run (planned, interrupted or lost) to running in a new segment."""

        def work(conn: Connection) -> Claim:
            row = _run_row(conn, run_id, self.url)
            if not can_transition(row.status, RUNNING):
                raise IllegalTransition(_transition_refusal(run_id, row.status, RUNNING))
            try:
                return start_without_commit(
                    conn, row.campaign_id, run_id, row.status, row.config, worker,
                    start_step, resumed_from,
                )  # fmt: skip
            except LookupError as race:
                raise IllegalTransition(f"{race} (another worker took it)") from None

        return self._write(work, f"starting run {run_id}")

    def finish(self, run_id: str, status: str, stop: StopInfo, *, lease: str | None = None) -> None:
        """End a running run: status, stop cause/step/phase/detail and event, one transaction.

        ``status`` must be an end status whose causes include ``stop.cause``
        (e.g. ``diverged`` with ``loss_explosion``); open segments are closed.
        With ``lease``, the end is refused (:class:`LeaseLost`) unless the run
        is still running under that lease.
        """
        _check_end(run_id, status, stop)

        def work(conn: Connection) -> None:
            row = _run_row(conn, run_id, self.url)
            hold_lease(conn, run_id, lease)
            if not can_transition(row.status, status):
                raise IllegalTransition(_transition_refusal(run_id, row.status, status))
            changed = conn.execute(
                sql.END_RUN if lease is None else sql.END_LEASED_RUN,
                {"p_run_id": run_id, "p_old_status": row.status, "p_status": status,
                 "p_stop_cause": stop.cause, "p_stop_step": stop.step,
                 "p_stop_phase": stop.phase, "p_stop_detail": stop.detail, "p_lease": lease},
            ).rowcount  # fmt: skip
            if changed != 1:
                raise IllegalTransition(f"run {run_id} changed status while it was being ended")
            conn.execute(sql.END_OPEN_SEGMENTS, {"p_run_id": run_id, "p_end_step": stop.step})
            where = f" at step {stop.step}" if stop.step is not None else ""
            phase = f" ({stop.phase})" if stop.phase else ""
            detail = f"{row.status} -> {status}: {stop.cause}{where}{phase}"
            if stop.detail:
                detail += f": {stop.detail}"
            _event(conn, row.campaign_id, run_id, status, detail)

        self._write(work, f"ending run {run_id}")

    def heartbeat(self, run_id: str, *, lease: str | None = None) -> bool:
        """Stamp the run's heartbeat with the database's clock.

        False when the run is not running (or, with ``lease``, no longer
        running under that lease): the caller has lost the run.
        """
        statement = sql.HEARTBEAT if lease is None else sql.LEASED_HEARTBEAT

        def work(conn: Connection) -> bool:
            return conn.execute(statement, {"p_run_id": run_id, "p_lease": lease}).rowcount == 1

        return self._write(work, f"heartbeat of run {run_id}")

    def mark_lost(
        self, stale_after_s: float, campaign: str | None = None, dead_workers: Sequence[str] = ()
    ) -> list[LostRun]:
        """Declare ``lost`` (stop cause ``heartbeat_lost``, with event) every running run whose
        heartbeat is older than ``stale_after_s`` on the database's clock, or whose worker is
        in ``dead_workers`` (processes a launcher saw end); returns them."""
        if stale_after_s <= 0:
            raise LedgerInputError("the heartbeat limit must be a positive number of seconds")

        def work(conn: Connection) -> list[LostRun]:
            campaign_id = None if campaign is None else self._campaign_id(conn, campaign)
            return mark_stale_lost_without_commit(conn, stale_after_s, campaign_id, dead_workers)

        if not self._read(lambda c: any_stale(c, stale_after_s, dead_workers), "sweeping runs"):
            return []
        return self._write(work, "marking runs without a heartbeat as lost")

    def set_environment(
        self, run_id: str, environment: Mapping[str, Any], *, lease: str | None = None
    ) -> None:
        """Record the software stack a run executes on (torch, CUDA, devices, host...)."""
        text = canonical_json(dict(environment))

        def work(conn: Connection) -> None:
            _run_row(conn, run_id, self.url)
            hold_lease(conn, run_id, lease)
            conn.execute(update(runs_t).where(runs_t.c.id == run_id).values(environment=text))

        self._write(work, f"recording the environment of run {run_id}")

    def end_segment(self, segment_id: int, end_step: int) -> None:
        def work(conn: Connection) -> None:
            conn.execute(
                update(segments_t)
                .where(segments_t.c.id == segment_id, segments_t.c.ended_at.is_(None))
                .values(end_step=end_step, ended_at=utcnow())
            )

        self._write(work, f"ending segment {segment_id}")

    def metric_writer(
        self,
        run_id: str,
        segment_id: int,
        *,
        batch_size: int = 1000,
        interval_s: float = 5.0,
        lease: str | None = None,
    ) -> MetricWriter:
        """A buffered writer for one segment's metric points (see :mod:`.metrics`)."""
        return MetricWriter(
            self.engine,
            run_id,
            segment_id,
            batch_size=batch_size,
            interval_s=interval_s,
            lease=lease,
        )

    # -- events, notes, artifacts, measurements -------------------------------------

    def add_event(self, campaign: str, kind: str, detail: str | None = None,
                  run_id: str | None = None, *, lease: str | None = None) -> None:  # fmt: skip
        """Append a lifecycle event (campaign-level when ``run_id`` is None)."""

        def work(conn: Connection) -> None:
            campaign_id = self._campaign_id(conn, campaign)
            if run_id is not None:
                _run_campaign(conn, run_id, campaign_id)
                hold_lease(conn, run_id, lease)
            _event(conn, campaign_id, run_id, kind, detail)

        self._write(work, f"recording event {kind!r}")

    def add_note(self, campaign: str, text: str) -> None:
        if not text.strip():
            raise LedgerInputError("a note needs text")

        def work(conn: Connection) -> None:
            campaign_id = self._campaign_id(conn, campaign)
            conn.execute(insert(notes_t).values(campaign_id=campaign_id, text=text))

        self._write(work, f"adding a note to {campaign!r}")

    def add_artifact(
        self,
        run_id: str,
        kind: str,
        path: str,
        sha256: str,
        size: int,
        step: int | None = None,
        *,
        lease: str | None = None,
    ) -> int:
        """Record a file a run produced with its SHA-256 and size; returns its id."""

        def work(conn: Connection) -> int:
            _run_row(conn, run_id, self.url)
            hold_lease(conn, run_id, lease)
            return conn.execute(
                insert(artifacts_t)
                .values(run_id=run_id, kind=kind, path=path, sha256=sha256, bytes=size, step=step)
                .returning(artifacts_t.c.id)
            ).scalar_one()

        return self._write(work, f"recording an artifact of run {run_id}")

    def create_pilot(self, campaign: str, config_sha256: str,
                     environment: Mapping[str, Any] | None = None) -> int:  # fmt: skip
        stack = None if environment is None else canonical_json(dict(environment))

        def work(conn: Connection) -> int:
            return conn.execute(
                insert(pilots_t)
                .values(campaign_id=self._campaign_id(conn, campaign),
                        config_sha256=config_sha256,
                        environment=stack)
                .returning(pilots_t.c.id)
            ).scalar_one()  # fmt: skip

        return self._write(work, f"recording a pilot of {campaign!r}")

    def set_pilot_verdict(self, pilot_id: int, verdict: str) -> None:
        def work(conn: Connection) -> None:
            conn.execute(update(pilots_t).where(pilots_t.c.id == pilot_id).values(verdict=verdict))

        self._write(work, f"recording the verdict of pilot {pilot_id}")

    def add_phase_measurements(
        self, rows: Iterable[Mapping[str, Any]], *, lease: str | None = None
    ) -> None:
        """Insert phase measurement rows (each with ``run_id`` or ``pilot_id``); with ``lease``
        every run named must still be running under it."""
        prepared = []
        for row in rows:
            item = dict(row)
            if isinstance(item.get("inputs"), Mapping):
                item["inputs"] = canonical_json(dict(item["inputs"]))
            prepared.append(item)
        if not prepared:
            return

        def work(conn: Connection) -> None:
            for run_id in sorted({r["run_id"] for r in prepared if r.get("run_id")}):
                hold_lease(conn, run_id, lease)
            conn.execute(insert(phases_t), prepared)

        self._write(work, "recording phase measurements")

    # -- reads (DataFrames) -----------------------------------------------------------

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
        campaign_id = self._read(lambda c: self._campaign_id(c, campaign), "reading runs")
        sql = (
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
            sql += f" AND r.status IN {frames.in_list(statuses)}"
            params += statuses
        return frames.query_frame(
            self.engine, sql + " ORDER BY r.id", params, f"reading runs of {campaign!r}"
        )

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
        sql = (
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
        sql += " WHERE " + " AND ".join(clauses) + " ORDER BY m.run_id, m.key, m.step, m.segment_id"
        frame = frames.query_frame(self.engine, sql, params, "reading metrics")
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
        frame = frames.query_frame(
            self.engine,
            "SELECT r.id AS run_id, (SELECT MAX(m.step) FROM metrics m WHERE m.run_id = r.id "
            f"AND m.key = ?) AS step FROM runs r WHERE r.id IN {frames.in_list(run_ids)}",
            [key, *run_ids],
            "reading progress",
        )
        return {
            str(row.run_id): int(row.step) for row in frame.itertuples() if pd.notna(row.step)
        }

    def progress_rows(self, campaign: str) -> tuple[datetime, list[dict[str, Any]]]:
        """The database's clock and one plain row per run (no DataFrame): what a progress
        display polls every second, so it stays a single cheap query."""

        def work(conn: Connection) -> tuple[datetime, list[dict[str, Any]]]:
            campaign_id = self._campaign_id(conn, campaign)
            now = database_now(conn)
            rows = conn.execute(
                select(runs_t.c.id, variants_t.c.name.label("variant"), runs_t.c.seed,
                       runs_t.c.status, runs_t.c.worker, runs_t.c.stop_step, runs_t.c.config,
                       runs_t.c.started_at, runs_t.c.ended_at, runs_t.c.heartbeat_at)
                .join(variants_t, variants_t.c.id == runs_t.c.variant_id)
                .where(runs_t.c.campaign_id == campaign_id)
                .order_by(runs_t.c.id)
            ).all()  # fmt: skip
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

    def balance(self, campaign: str) -> Any:
        """The campaign's balance sheet (``.runs``, ``.variants``, ``.deltas``, ``.phases``,
        ``.notes`` DataFrames) for notebooks: the frames ``campaign report`` exports.

        Built by :mod:`campaign.report.balance` from this ledger's reads only; imported
        here lazily so that the ledger package itself depends on nothing else of ours.
        """
        from campaign.report.balance import balance_sheet

        return balance_sheet(self, campaign)

    def events(self, campaign: str, run_id: str | None = None) -> pd.DataFrame:
        sql = "SELECT id, run_id, at, kind, detail FROM events WHERE campaign_id = ?"
        extra: list[Any] = []
        if run_id is not None:
            sql += " AND run_id = ?"
            extra.append(run_id)
        return self._campaign_frame(campaign, sql + " ORDER BY id", "events", extra)

    def notes(self, campaign: str) -> pd.DataFrame:
        return self._campaign_frame(
            campaign, "SELECT id, at, text FROM notes WHERE campaign_id = ? ORDER BY id", "notes"
        )

    def segments(self, campaign: str) -> pd.DataFrame:
        return self._campaign_frame(
            campaign,
            "SELECT s.id AS segment_id, s.run_id, s.ordinal, s.start_step, s.end_step, s.worker, "
            "s.started_at, s.ended_at, s.resumed_from FROM segments s JOIN runs r "
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
            "SELECT id AS pilot_id, config_sha256, verdict, environment, created_at FROM pilots "
            "WHERE campaign_id = ? ORDER BY id",
            "pilots",
        )

    def pilot_passed(self, campaign: str) -> bool:
        """True when the latest pilot for the campaign's frozen spec passed (the launch gate)."""
        pilots = self.pilots(campaign)
        spec_hash = self.campaign(campaign).spec_sha256
        mine = pilots[pilots["config_sha256"] == spec_hash]
        return bool(len(mine)) and mine["verdict"].iloc[-1] == "pass"

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
        self, campaign: str, sql: str, what: str, extra: Sequence[Any] = (), placeholders: int = 1
    ) -> pd.DataFrame:
        """Run ``sql`` with the campaign's id bound to its first ``placeholders`` markers."""
        campaign_id = self._read(lambda c: self._campaign_id(c, campaign), f"reading {what}")
        params = [campaign_id] * placeholders + list(extra)
        return frames.query_frame(self.engine, sql, params, f"reading {what} of {campaign!r}")

    # -- helpers ----------------------------------------------------------------------

    def _campaign_id(self, conn: Connection, name: str) -> int:
        if name in self._campaign_ids:
            return self._campaign_ids[name]
        campaign_id = conn.execute(
            select(campaigns_t.c.id).where(campaigns_t.c.name == name)
        ).scalar()
        if campaign_id is None:
            raise NotFound(f"no campaign named {name!r} in ledger {self.url}")
        self._campaign_ids[name] = int(campaign_id)
        return int(campaign_id)


def _check_plan(name: str, variants: Sequence[NewVariant], runs: Sequence[NewRun]) -> None:
    if not name.strip():
        raise LedgerInputError("a campaign needs a name")
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise LedgerInputError(f"campaign {name!r}: variant names must be unique")
    if variants and sum(v.is_control for v in variants) != 1:
        raise LedgerInputError(f"campaign {name!r}: exactly one variant must be the control")
    for run in runs:
        if run.variant not in names:
            raise LedgerInputError(f"campaign {name!r}: run names unknown variant {run.variant!r}")


def _check_end(run_id: str, status: str, stop: StopInfo) -> None:
    if status not in ENDED_STATUSES:
        raise LedgerInputError(
            f"run {run_id}: {status!r} is not an end status "
            f"(expected one of {', '.join(sorted(ENDED_STATUSES))})"
        )
    allowed = CAUSES_BY_STATUS[status]
    if stop.cause not in allowed:
        raise LedgerInputError(
            f"run {run_id}: stop cause {stop.cause!r} does not fit status {status!r} "
            f"(expected {', '.join(sorted(allowed))})"
        )


def _transition_refusal(run_id: str, current: str, new: str) -> str:
    if current in TERMINAL_STATUSES:
        return f"run {run_id} is {current}, a terminal status: it is final (relaunch it instead)"
    if current == RUNNING and new == RUNNING:
        return f"run {run_id} is already running"
    hint = " (resume it)" if current in RESUMABLE_STATUSES else ""
    return f"run {run_id} cannot go from {current} to {new}{hint}"


def _run_row(conn: Connection, run_id: str, url: str) -> Any:
    row = conn.execute(sql.RUN_ROW, {"p_run_id": run_id}).first()
    if row is None:
        raise NotFound(f"no run {run_id!r} in ledger {url}")
    return row


def _run_campaign(conn: Connection, run_id: str, campaign_id: int) -> None:
    owner = conn.execute(select(runs_t.c.campaign_id).where(runs_t.c.id == run_id)).scalar()
    if owner is None:
        raise NotFound(f"no run {run_id!r} in this ledger")
    if owner != campaign_id:
        raise LedgerInputError(f"run {run_id} belongs to another campaign")


def _event(conn: Connection, campaign_id: int, run_id: str | None, kind: str,
           detail: str | None) -> None:  # fmt: skip
    conn.execute(
        sql.INSERT_EVENT,
        {"campaign_id": campaign_id, "run_id": run_id, "kind": kind, "detail": detail},
    )


def _campaign_by_id(conn: Connection, campaign_id: int, run_ids: tuple[str, ...]) -> CampaignRecord:
    m = conn.execute(select(campaigns_t).where(campaigns_t.c.id == campaign_id)).one()._mapping
    return CampaignRecord(
        id=m["id"], name=m["name"], question=m["question"], task=m["task"], spec=m["spec"],
        spec_sha256=m["spec_sha256"], created_at=as_utc(m["created_at"]), run_ids=run_ids,
    )  # fmt: skip
