"""The lifecycle's SQL statements, built once at import.

Building a SQLAlchemy statement per call (``select(...).where(...)``,
``.values(...)``) cost more than executing it on SQLite; run creation,
claims and ends are on every worker's path, so their statements are
constructed here once, with bound parameters (named ``p_*``: SQLAlchemy
reserves column names for its own SET parameters).
"""

from __future__ import annotations

from sqlalchemy import bindparam, func, insert, select, update

from campaign.ledger.dialects import utcnow
from campaign.ledger.models import Event, Run, Segment, Variant
from campaign.ledger.vocabulary import PLANNED, RUNNING

runs = Run.__table__
segments = Segment.__table__
events = Event.__table__
variants = Variant.__table__

INSERT_RUN = insert(runs)
INSERT_EVENT = insert(events)
INSERT_SEGMENT = insert(segments).returning(segments.c.id)

VARIANT_ID = select(variants.c.id).where(
    variants.c.campaign_id == bindparam("p_campaign_id"), variants.c.name == bindparam("p_name")
)
RUN_ROW = select(runs.c.id, runs.c.status, runs.c.campaign_id, runs.c.config).where(
    runs.c.id == bindparam("p_run_id")
)
NEXT_PLANNED = (
    select(runs.c.id, runs.c.status, runs.c.config)
    .where(runs.c.campaign_id == bindparam("p_campaign_id"), runs.c.status == PLANNED)
    .order_by(runs.c.created_at, runs.c.id)
    .limit(1)
    .with_for_update(skip_locked=True)
)
NEXT_ORDINAL = select(func.coalesce(func.max(segments.c.ordinal), 0) + 1).where(
    segments.c.run_id == bindparam("p_run_id")
)

# Compare-and-set on the status read in the same transaction: a lost race
# changes no row instead of overwriting another worker's transition.
START_RUN = (
    update(runs)
    .where(runs.c.id == bindparam("p_run_id"), runs.c.status == bindparam("p_old_status"))
    .values(
        status=RUNNING,
        worker=bindparam("p_worker"),
        lease_token=bindparam("p_lease"),
        heartbeat_at=utcnow(),
        started_at=func.coalesce(runs.c.started_at, utcnow()),
        ended_at=None,
        stop_cause=None,
        stop_step=None,
        stop_phase=None,
        stop_detail=None,
    )
)
END_RUN = (
    update(runs)
    .where(runs.c.id == bindparam("p_run_id"), runs.c.status == bindparam("p_old_status"))
    .values(
        status=bindparam("p_status"),
        stop_cause=bindparam("p_stop_cause"),
        stop_step=bindparam("p_stop_step"),
        stop_phase=bindparam("p_stop_phase"),
        stop_detail=bindparam("p_stop_detail"),
        ended_at=utcnow(),
    )
)
END_OPEN_SEGMENTS = (
    update(segments)
    .where(segments.c.run_id == bindparam("p_run_id"), segments.c.ended_at.is_(None))
    .values(ended_at=utcnow(), end_step=bindparam("p_end_step"),
            training_s=bindparam("p_training_s"))
)
# A leased end or heartbeat also checks the token: a worker whose run was
# declared lost or reclaimed changes nothing.
END_LEASED_RUN = END_RUN.where(runs.c.lease_token == bindparam("p_lease"))
HEARTBEAT = (
    update(runs)
    .where(runs.c.id == bindparam("p_run_id"), runs.c.status == RUNNING)
    .values(heartbeat_at=utcnow())
)
LEASED_HEARTBEAT = HEARTBEAT.where(runs.c.lease_token == bindparam("p_lease"))
