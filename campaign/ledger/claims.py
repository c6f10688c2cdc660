"""Atomic claims: a worker takes a run so that no run ever executes twice at once.

PostgreSQL: ``SELECT ... FOR UPDATE SKIP LOCKED`` lets many workers pick
different planned runs without waiting on each other. SQLite: the claiming
transaction begins IMMEDIATE, so it already holds the only write lock;
SQLAlchemy renders no ``FOR UPDATE`` there. The same statement serves both.
Claiming writes the worker identity, the first heartbeat, a new segment and
the ``running`` event in one transaction.
"""

from __future__ import annotations

from sqlalchemy import Connection, func, insert, select, update

from campaign.ledger.dialects import utcnow
from campaign.ledger.models import Event, Run, Segment
from campaign.ledger.records import Claim
from campaign.ledger.vocabulary import PLANNED, RUNNING

runs = Run.__table__
segments = Segment.__table__
events = Event.__table__


def claim_next_without_commit(conn: Connection, campaign_id: int, worker: str) -> Claim | None:
    """Claim the oldest planned run of a campaign, or return None when none is left."""
    query = (
        select(runs.c.id, runs.c.status, runs.c.config)
        .where(runs.c.campaign_id == campaign_id, runs.c.status == PLANNED)
        .order_by(runs.c.created_at, runs.c.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    row = conn.execute(query).first()
    if row is None:
        return None
    return start_without_commit(conn, campaign_id, row.id, row.status, row.config, worker)


def start_without_commit(
    conn: Connection, campaign_id: int, run_id: str, status: str, config: str, worker: str,
    start_step: int = 0, resumed_from: int | None = None,
) -> Claim:  # fmt: skip
    """Move ``run_id`` from ``status`` to running and open its next segment."""
    now = utcnow()
    changed = conn.execute(
        update(runs)
        .where(runs.c.id == run_id, runs.c.status == status)
        .values(
            status=RUNNING,
            worker=worker,
            heartbeat_at=now,
            started_at=func.coalesce(runs.c.started_at, now),
            ended_at=None,
            stop_cause=None,
            stop_step=None,
            stop_phase=None,
            stop_detail=None,
        )
    ).rowcount
    if changed != 1:
        raise LookupError(f"run {run_id} is no longer {status}")
    ordinal = 1  # a planned run has no segment yet
    if status != PLANNED:
        ordinal = conn.execute(
            select(func.coalesce(func.max(segments.c.ordinal), 0) + 1).where(
                segments.c.run_id == run_id
            )
        ).scalar_one()
    segment_id = conn.execute(
        insert(segments)
        .values(run_id=run_id, ordinal=ordinal, start_step=start_step, worker=worker,
                resumed_from=resumed_from)
        .returning(segments.c.id)
    ).scalar_one()  # fmt: skip
    kind = "running" if status == PLANNED else "resumed"
    conn.execute(
        insert(events).values(
            campaign_id=campaign_id,
            run_id=run_id,
            kind=kind,
            detail=f"{status} -> running, segment {ordinal}, worker {worker}",
        )
    )
    return Claim(run_id, segment_id, ordinal, config, worker)
