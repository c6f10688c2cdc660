"""Leases: who may write a running run's segment, and how stale runs become ``lost``.

Every engine runs work at least once (Ray retries a task, SLURM requeues a
job, a paused process wakes up), so a claim hands out a random lease token,
stored on the run and on the segment it opens. Writes of a leased segment
check the token in the same transaction: the run must still be ``running``
under that token. On PostgreSQL the check takes ``FOR SHARE`` on the run's
row, so a concurrent "mark lost" or reclaim (which updates the row) either
happens before the write (the write is refused) or after it commits; on
SQLite the writing transaction already holds the only write lock.

Staleness is judged on the database's clock only: heartbeats from many
machines are stamped by the database, and so is the cutoff.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, DateTime, bindparam, func, or_, select, update

from campaign.errors import LeaseLost
from campaign.ledger import statements as sql
from campaign.ledger.dialects import server_started_at, utcnow
from campaign.ledger.models import Metric
from campaign.ledger.vocabulary import RUNNING

runs = sql.runs
metrics = Metric.__table__

LEASE_HELD = (
    select(runs.c.id)
    .where(
        runs.c.id == bindparam("p_run_id"),
        runs.c.status == RUNNING,
        runs.c.lease_token == bindparam("p_lease"),
    )
    .with_for_update(read=True)
)
DATABASE_NOW = select(utcnow())
_STALE = or_(
    runs.c.heartbeat_at < bindparam("p_cutoff", type_=DateTime(timezone=True)),
    runs.c.worker.in_(bindparam("p_dead", expanding=True)),
)
STALE_RUNNING = (
    select(runs.c.id, runs.c.campaign_id, runs.c.worker, runs.c.heartbeat_at)
    .where(runs.c.status == RUNNING, _STALE)
    .order_by(runs.c.id)
)
# The sweep skips a run whose row another transaction holds (a paused worker mid-write): it
# never waits behind it, and the next sweep, after the server ended that session, takes it.
STALE_RUNNING_TO_MARK = STALE_RUNNING.with_for_update(skip_locked=True)
LIVE_RUNNING = select(runs.c.id, runs.c.worker).where(
    runs.c.status == RUNNING,
    runs.c.heartbeat_at >= bindparam("p_cutoff", type_=DateTime(timezone=True)),
)
LAST_STEP = select(func.max(metrics.c.step)).where(
    metrics.c.run_id == bindparam("p_run_id"), metrics.c.key == "train/loss"
)
# Compare-and-set on status and heartbeat: a run whose heartbeat arrived after
# the sweep read it is left alone.
MARK_LOST = (
    update(runs)
    .where(runs.c.id == bindparam("p_run_id"), runs.c.status == RUNNING, _STALE)
    .values(
        status="lost",
        stop_cause="heartbeat_lost",
        stop_step=bindparam("p_stop_step"),
        stop_phase=None,
        stop_detail=bindparam("p_stop_detail"),
        ended_at=utcnow(),
    )
)


@dataclass(frozen=True)
class LostRun:
    """A run that a sweep declared lost."""

    run_id: str
    campaign_id: int
    worker: str | None
    silent_s: float
    last_step: int | None


def new_lease_token() -> str:
    """128 random bits: unguessable, so only the claimant can write under it."""
    return secrets.token_hex(16)


def hold_lease(conn: Connection, run_id: str, lease: str | None) -> None:
    """Raise :class:`LeaseLost` unless ``run_id`` is running under ``lease`` (None: no check)."""
    if lease is None:
        return
    if conn.execute(LEASE_HELD, {"p_run_id": run_id, "p_lease": lease}).first() is None:
        raise LeaseLost(
            f"run {run_id}: this worker's lease is gone (the run was declared lost or taken "
            "by another worker); its writes are refused"
        )


def any_stale(conn: Connection, stale_after_s: float, dead_workers: Sequence[str] = ()) -> bool:
    """A read-only look first: sweeps run every few seconds and almost always find nothing,
    so they should not take SQLite's write lock for it."""
    cutoff = _cutoff(conn, stale_after_s)[1]
    rows = conn.execute(STALE_RUNNING, {"p_cutoff": cutoff, "p_dead": list(dead_workers)})
    return rows.first() is not None


def database_now(conn: Connection) -> datetime:
    """The database's clock (the one that stamps heartbeats), naive on SQLite, aware on PG."""
    now = conn.execute(DATABASE_NOW).scalar_one()
    return datetime.fromisoformat(now) if isinstance(now, str) else now  # SQLite: strftime text


def live_runs(conn: Connection, lease_s: float) -> list[Any]:
    """Running runs whose heartbeat is younger than ``lease_s`` (id, worker)."""
    return list(conn.execute(LIVE_RUNNING, {"p_cutoff": _cutoff(conn, lease_s)[1]}).all())


def _cutoff(conn: Connection, stale_after_s: float) -> tuple[datetime, datetime]:
    """The database's now, and the heartbeat age past which a run is stale. Never across an
    outage: until the server has been up a full ``stale_after_s`` (a restart), no heartbeat is
    stale, since the runs could not beat while it was down (docs/runs.md, faults)."""
    now = database_now(conn)
    cutoff = now - timedelta(seconds=stale_after_s)
    started = server_started_at(conn)
    if started is not None and started > cutoff:
        cutoff = datetime.min.replace(tzinfo=now.tzinfo)
    return now, cutoff


def mark_stale_lost_without_commit(
    conn: Connection,
    stale_after_s: float,
    campaign_id: int | None = None,
    dead_workers: Sequence[str] = (),
    *,
    dry_run: bool = False,
) -> list[LostRun]:
    """Declare ``lost`` every running run whose heartbeat is older than ``stale_after_s``, or
    whose worker is known to be dead (a launcher reaped its process on this host). With
    ``dry_run``, only list them: the same rule, nothing written."""
    dead = list(dead_workers)
    now, cutoff = _cutoff(conn, stale_after_s)
    lost: list[LostRun] = []
    stale = STALE_RUNNING if dry_run else STALE_RUNNING_TO_MARK
    for row in conn.execute(stale, {"p_cutoff": cutoff, "p_dead": dead}).all():
        if campaign_id is not None and row.campaign_id != campaign_id:
            continue
        heartbeat = row.heartbeat_at
        if isinstance(heartbeat, str):
            heartbeat = datetime.fromisoformat(heartbeat)
        silent = (_naive(now) - _naive(heartbeat)).total_seconds()
        last_step = conn.execute(LAST_STEP, {"p_run_id": row.id}).scalar()
        detail = (
            f"worker {row.worker} process ended without ending the run"
            if row.worker in dead
            else f"no heartbeat for {silent:.0f} s (limit {stale_after_s:g} s) "
            f"from worker {row.worker}"
        )
        if dry_run:
            lost.append(LostRun(row.id, row.campaign_id, row.worker, silent, last_step))
            continue
        changed = conn.execute(
            MARK_LOST,
            {"p_run_id": row.id, "p_cutoff": cutoff, "p_dead": dead, "p_stop_step": last_step,
             "p_stop_detail": detail},
        ).rowcount
        if changed != 1:
            continue
        conn.execute(sql.END_OPEN_SEGMENTS,
                     {"p_run_id": row.id, "p_end_step": last_step, "p_training_s": None})
        conn.execute(
            sql.INSERT_EVENT,
            {"campaign_id": row.campaign_id, "run_id": row.id, "kind": "lost",
             "detail": f"running -> lost: heartbeat_lost: {detail}"},
        )
        lost.append(LostRun(row.id, row.campaign_id, row.worker, silent, last_step))
    return lost


def _naive(moment: datetime) -> datetime:
    return moment.replace(tzinfo=None) if moment.tzinfo is not None else moment
