"""The Ledger: the one API through which commands, the loop and notebooks use the database.

Writes are short transactions (``BEGIN IMMEDIATE`` on SQLite) with bounded
retries on lock and serialization races; every status change writes its
``events`` row in the same transaction. Reads return pandas DataFrames or
frozen records, never live ORM rows. The database enforces immutability
itself (triggers in ``migrations/``); this class checks the same rules first
so that a mistake gets a precise message instead of a trigger's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, insert, select, update

from campaign.errors import IllegalTransition, LedgerInputError, NoLedger, NotFound
from campaign.ledger import migrate
from campaign.ledger import statements as sql
from campaign.ledger.canonical import canonical_json, sha256_text
from campaign.ledger.claims import claim_next_without_commit, start_without_commit
from campaign.ledger.connections import Done, create_ledger_engine, parse_url, sqlite_path
from campaign.ledger.connections import patient as engine_patience
from campaign.ledger.dialects import utcnow
from campaign.ledger.evidence import EvidenceWrites, record_event, run_campaign, run_row
from campaign.ledger.ids import new_run_id
from campaign.ledger.leases import (
    LostRun,
    any_stale,
    hold_lease,
    mark_stale_lost_without_commit,
    new_lease_token,
)
from campaign.ledger.location import resolve_url
from campaign.ledger.metrics import MetricWriter
from campaign.ledger.models import Campaign, Event, Run, Variant
from campaign.ledger.outage import back_for_less_than, riding_out
from campaign.ledger.reads import campaign_by_id
from campaign.ledger.records import (
    CampaignRecord,
    Claim,
    NewRun,
    NewVariant,
    StopRecord,
)
from campaign.ledger.rules import check_end, check_plan, transition_refusal
from campaign.ledger.settled import claim_under, ended_as, run_there
from campaign.ledger.vocabulary import (
    PLANNED,
    RUNNING,
    WITHDRAWN,
    can_transition,
)

campaigns_t = Campaign.__table__
variants_t = Variant.__table__
runs_t = Run.__table__
NEVER_STALE_S = 10 * 365 * 24 * 3600.0  # a heartbeat limit no run reaches
events_t = Event.__table__


class Ledger(EvidenceWrites):
    """A campaign ledger on SQLite or PostgreSQL: the reads of :class:`LedgerReader` and the
    writes, each one transaction that turns driver errors into the ledger's own.

    Open with :meth:`open`; use as a context manager or call :meth:`close`.
    """

    @classmethod
    def open(cls, url: str | None = None, *, create: bool = False, check: bool = True,
             patient: bool = False, ride_out: bool = False) -> Ledger:
        """Open the ledger at ``url`` (else ``CAMPAIGN_LEDGER``, else ``sqlite:///campaign.db``).

        With ``create``, a missing SQLite file or an empty database is created
        at the head revision; without it, a missing SQLite file is refused
        (:class:`NoLedger`) and nothing is created. A ledger at an older or
        unknown revision is refused (``check``) with a message naming
        ``campaign db upgrade``; nothing is written to it. ``patient``: writes wait out
        several SQLite busy timeouts in a row (a run's process, see ``RUN_LOCK_ATTEMPTS``) and
        ride out an outage; ``ride_out``: only the latter (a worker, a launcher, a supervisor:
        :mod:`campaign.ledger.outage`).
        """
        parsed = parse_url(resolve_url(url))
        path = sqlite_path(parsed)
        if not create and path is not None and not path.exists():
            raise NoLedger(f"no ledger at {path}")
        existed = path is None or path.exists()
        engine = create_ledger_engine(parsed)
        try:
            if check:
                migrate.ensure_ready(engine, create=create)
        except BaseException:
            engine.dispose()
            if not existed and path is not None and _empty_file(path):  # a new ledger that
                for leftover in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm"))):
                    leftover.unlink(missing_ok=True)  # failed (a full disk): no empty file left
            raise
        if patient:
            return cls(engine_patience(engine))
        return cls(riding_out(engine) if ride_out else engine)

    def impatient(self) -> Ledger:
        """This ledger giving up at once on an outage (sharing its pool): for a periodic write
        that had better skip a turn than block its caller (a supervisor's heartbeat)."""
        return type(self)(riding_out(self.engine, 0.0))

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
        check_plan(name, variants, runs)
        run_rows = [
            {"id": new_run_id(), "variant": run.variant, "seed": run.seed,
             "config": canonical_json(run.config)}
            for run in runs
        ]

        def work(conn: Connection) -> CampaignRecord:
            campaign_id = conn.execute(
                insert(campaigns_t)
                .values(name=name, question=question, spec=spec_text,
                        spec_sha256=sha256_text(spec_text), task=task)
                .returning(campaigns_t.c.id)
            ).scalar_one()
            variant_ids = {}
            for variant in variants:
                variant_ids[variant.name] = conn.execute(
                    insert(variants_t)
                    .values(campaign_id=campaign_id, name=variant.name,
                            is_control=variant.is_control,
                            overrides=canonical_json(dict(variant.overrides)))
                    .returning(variants_t.c.id)
                ).scalar_one()
            if run_rows:
                conn.execute(
                    insert(runs_t),
                    [
                        {"id": r["id"], "campaign_id": campaign_id,
                         "variant_id": variant_ids[r["variant"]], "seed": r["seed"],
                         "config": r["config"], "config_sha256": sha256_text(r["config"])}
                        for r in run_rows
                    ],
                )
                conn.execute(
                    insert(events_t),
                    [
                        {"campaign_id": campaign_id, "run_id": r["id"], "kind": "planned",
                         "detail": f"variant {r['variant']}, seed {r['seed']}"}
                        for r in run_rows
                    ],
                )
            return campaign_by_id(conn, campaign_id, tuple(r["id"] for r in run_rows))

        def settled(conn: Connection) -> Done[CampaignRecord] | None:
            found = conn.execute(select(campaigns_t.c.id).where(
                campaigns_t.c.name == name, campaigns_t.c.spec_sha256 == sha256_text(spec_text)
            )).scalar()
            if found is None or (run_rows and run_there(conn, run_rows[0]["id"]) is None):
                return None
            return Done(campaign_by_id(conn, found, tuple(r["id"] for r in run_rows)))

        return self._write(work, f"recording campaign {name!r}", settled)

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

        The old run is never touched: it keeps its status forever (an ended run takes no
        more rows, so the ``relaunched`` event naming both ids is the campaign's).
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
                run_campaign(conn, relaunch_of, campaign_id)
            else:
                _refuse_second_original(conn, variant_id, variant, seed)
            conn.execute(
                sql.INSERT_RUN,
                {"id": run_id, "campaign_id": campaign_id, "variant_id": variant_id, "seed": seed,
                 "config": config_text, "config_sha256": sha256_text(config_text),
                 "relaunch_of": relaunch_of, "relaunch_reason": reason},
            )
            detail = f"variant {variant}, seed {seed}"
            if relaunch_of is not None:
                detail += f", relaunch of {relaunch_of}: {reason}"
                record_event(conn, campaign_id, None, "relaunched",
                             f"run {relaunch_of} as {run_id}: {reason}")
            record_event(conn, campaign_id, run_id, "planned", detail)
            return run_id

        return self._write(work, f"planning a run of {campaign!r}",
                           lambda conn: run_there(conn, run_id))

    # -- lifecycle ------------------------------------------------------------------

    def claim_next(self, campaign: str, worker: str) -> Claim | None:
        """Atomically take the next planned run of ``campaign``; None when none is left."""

        lease = new_lease_token()

        def work(conn: Connection) -> Claim | None:
            return claim_next_without_commit(
                conn, self._campaign_id(conn, campaign), worker, lease)

        return self._write(work, f"claiming a run of {campaign!r}",
                           lambda conn: claim_under(conn, lease))

    def start(
        self, run_id: str, worker: str, *, start_step: int = 0, resumed_from: int | None = None
    ) -> Claim:
        """Move one named run (planned, interrupted or lost) to running in a new segment."""
        lease = new_lease_token()

        def work(conn: Connection) -> Claim:
            row = run_row(conn, run_id, self.url)
            if not can_transition(row.status, RUNNING):
                raise IllegalTransition(transition_refusal(run_id, row.status, RUNNING))
            try:
                return start_without_commit(
                    conn, row.campaign_id, run_id, row.status, row.config, worker, lease,
                    start_step, resumed_from,
                )
            except LookupError as race:
                raise IllegalTransition(f"{race} (another worker took it)") from None

        return self._write(work, f"starting run {run_id}", lambda conn: claim_under(conn, lease))

    def finish(
        self,
        run_id: str,
        status: str,
        stop: StopRecord,
        *,
        lease: str | None = None,
        training_s: float | None = None,
    ) -> None:
        """End a running run: status, stop cause/step/phase/detail and event, one transaction.

        ``status`` must be an end status whose causes include ``stop.cause``
        (e.g. ``diverged`` with ``loss_explosion``); open segments are closed.
        With ``lease``, the end is refused (:class:`LeaseLost`) unless the run
        is still running under that lease. ``training_s``: the seconds the
        segment spent in updates and validation (the rest was overhead).
        """
        check_end(run_id, status, stop)

        def work(conn: Connection) -> None:
            row = run_row(conn, run_id, self.url)
            hold_lease(conn, run_id, lease)
            if not can_transition(row.status, status):
                raise IllegalTransition(transition_refusal(run_id, row.status, status))
            # The end's event first: nothing is added to a run once its end is written (0005).
            where = f" at step {stop.step}" if stop.step is not None else ""
            phase = f" ({stop.phase})" if stop.phase else ""
            detail = f"{row.status} -> {status}: {stop.cause}{where}{phase}"
            if stop.detail:
                detail += f": {stop.detail}"
            record_event(conn, row.campaign_id, run_id, status, detail)
            # Its segments end first: the database refuses a terminal run with an open one.
            conn.execute(sql.END_OPEN_SEGMENTS, {"p_run_id": run_id, "p_end_step": stop.step,
                                                 "p_training_s": training_s})
            changed = conn.execute(
                sql.END_RUN if lease is None else sql.END_LEASED_RUN,
                {"p_run_id": run_id, "p_old_status": row.status, "p_status": status,
                 "p_stop_cause": stop.cause, "p_stop_step": stop.step,
                 "p_stop_phase": stop.phase, "p_stop_detail": stop.detail, "p_lease": lease},
            ).rowcount
            if changed != 1:  # (the transaction, segment ends included, is rolled back)
                raise IllegalTransition(f"run {run_id} changed status while it was being ended")

        self._write(work, f"ending run {run_id}",
                    lambda conn: ended_as(conn, run_id, status, stop, lease))

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
        self,
        stale_after_s: float,
        campaign: str | None = None,
        dead_workers: Sequence[str] = (),
        *,
        dry_run: bool = False,
    ) -> list[LostRun]:
        """Declare ``lost`` (stop cause ``heartbeat_lost``, with event) every running run whose
        heartbeat is older than ``stale_after_s`` on the database's clock, or whose worker is
        in ``dead_workers`` (processes a launcher saw end); returns them. With ``dry_run``,
        return the runs the same rule would declare lost and write nothing."""
        if stale_after_s <= 0:
            raise LedgerInputError("the heartbeat limit must be a positive number of seconds")

        def limit() -> float:  # never across an outage this process saw: dead workers only
            return NEVER_STALE_S if back_for_less_than(stale_after_s) else stale_after_s

        def work(conn: Connection) -> list[LostRun]:
            campaign_id = None if campaign is None else self._campaign_id(conn, campaign)
            return mark_stale_lost_without_commit(
                conn, limit(), campaign_id, dead_workers, dry_run=dry_run
            )

        if dry_run:
            return self._read(work, "listing runs without a heartbeat")
        if not self._read(lambda c: any_stale(c, limit(), dead_workers), "sweeping runs"):
            return []
        return self._write(work, "marking runs without a heartbeat as lost")

    def set_environment(
        self, run_id: str, environment: Mapping[str, Any], *, lease: str | None = None
    ) -> None:
        """Record the software stack a run executes on (torch, CUDA, devices, host...), once:
        a resumed segment on another stack leaves the first record (the database refuses to
        rewrite it) and adds an ``environment_differs`` event naming what changed."""
        text = canonical_json(dict(environment))

        def work(conn: Connection) -> None:
            row = run_row(conn, run_id, self.url)
            hold_lease(conn, run_id, lease)
            stored = conn.execute(
                select(runs_t.c.environment).where(runs_t.c.id == run_id)
            ).scalar()
            if stored is None:
                conn.execute(update(runs_t).where(runs_t.c.id == run_id).values(environment=text))
            elif stored != text:
                first, now = json.loads(stored), dict(environment)
                changed = sorted(k for k in {*first, *now} if first.get(k) != now.get(k))
                record_event(conn, row.campaign_id, run_id, "environment_differs",
                             "this segment runs on another stack than the run's first: "
                             + ", ".join(f"{k}: {first.get(k)!r} -> {now.get(k)!r}"
                                         for k in changed))

        self._write(work, f"recording the environment of run {run_id}")

    def withdraw(self, run_id: str, reason: str) -> None:
        """Withdraw a planned run that will never execute (planned by mistake): status
        ``withdrawn``, the reason in ``stop_detail`` and a ``withdrawn`` event; it keeps its line,
        is never claimed, counts in no statistic. A run that left ``planned`` cannot be."""
        if not (reason and reason.strip()):
            raise LedgerInputError(f"withdrawing run {run_id} needs a reason")

        def work(conn: Connection) -> None:
            row = run_row(conn, run_id, self.url)
            if row.status != PLANNED:
                raise LedgerInputError(
                    f"run {run_id} is {row.status}: only a planned run can be withdrawn"
                    + (" (relaunch or let it end instead)" if row.status == RUNNING else "")
                )
            record_event(conn, row.campaign_id, run_id, WITHDRAWN, f"withdrawn: {reason.strip()}")
            changed = conn.execute(
                update(runs_t)
                .where(runs_t.c.id == run_id, runs_t.c.status == PLANNED)
                .values(status=WITHDRAWN, stop_detail=reason.strip(), ended_at=utcnow())
            ).rowcount
            if changed != 1:
                raise LedgerInputError(
                    f"run {run_id} was claimed while it was being withdrawn: only a planned run "
                    "can be withdrawn"
                )

        def settled(conn: Connection) -> Done[None] | None:
            return Done(None) if run_row(conn, run_id, self.url).status == WITHDRAWN else None

        self._write(work, f"withdrawing run {run_id}", settled)

    def metric_writer(
        self,
        run_id: str,
        segment_id: int,
        *,
        batch_size: int = 1000,
        interval_s: float = 5.0,
        lease: str | None = None,
        spill: Path | None = None,
    ) -> MetricWriter:
        """A buffered writer for one segment's metric points (see :mod:`.metrics`); with
        ``spill`` (a file in the run's folder) it keeps going through an outage."""
        return MetricWriter(self.engine, run_id, segment_id, batch_size=batch_size,
                            interval_s=interval_s, lease=lease, spill=spill)


def _empty_file(path: Path) -> bool:
    """Only an empty file is ours to remove (another process may be creating a ledger there)."""
    try:
        return path.stat().st_size == 0
    except OSError:
        return False


def _refuse_second_original(conn: Connection, variant_id: int, variant: str, seed: int) -> None:
    """One original run per (variant, seed): the counting rules pair seeds; a repeat is a
    relaunch (new id, linked, with a reason) and never a second original."""
    same_seed = (runs_t.c.variant_id == variant_id, runs_t.c.seed == seed)
    existing = conn.execute(
        select(runs_t.c.id).where(*same_seed, runs_t.c.relaunch_of.is_(None))
    ).scalar()
    if existing is not None:
        raise LedgerInputError(
            f"variant {variant!r} already has run {existing} for seed {seed}: relaunch it "
            "instead (relaunch_of and a reason), so the variant counts each seed once"
        )
