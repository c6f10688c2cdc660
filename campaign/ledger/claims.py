"""Atomic claims: a worker takes a run so that no run ever executes twice at once.

PostgreSQL: ``SELECT ... FOR UPDATE SKIP LOCKED`` lets many workers pick
different planned runs without waiting on each other. SQLite: the claiming
transaction begins IMMEDIATE, so it already holds the only write lock;
SQLAlchemy renders no ``FOR UPDATE`` there. The same statement serves both.
Claiming writes the worker identity, a fresh lease token (see
:mod:`.leases`), the first heartbeat, a new segment and the ``running`` event
in one transaction.
"""

from __future__ import annotations

from sqlalchemy import Connection

from campaign.ledger import statements as sql
from campaign.ledger.records import Claim
from campaign.ledger.vocabulary import PLANNED


def claim_next_without_commit(
    conn: Connection, campaign_id: int, worker: str, lease: str
) -> Claim | None:
    """Claim the oldest planned run of a campaign under ``lease`` (a token drawn for this claim
    alone, :func:`campaign.ledger.leases.new_lease_token`), or return None when none is left."""
    row = conn.execute(sql.NEXT_PLANNED, {"p_campaign_id": campaign_id}).first()
    if row is None:
        return None
    return start_without_commit(conn, campaign_id, row.id, row.status, row.config, worker, lease)


def start_without_commit(
    conn: Connection, campaign_id: int, run_id: str, status: str, config: str, worker: str,
    lease: str, start_step: int = 0, resumed_from: int | None = None,
) -> Claim:
    """Move ``run_id`` from ``status`` to running under ``lease`` and open its next segment."""
    changed = conn.execute(
        sql.START_RUN,
        {"p_run_id": run_id, "p_old_status": status, "p_worker": worker, "p_lease": lease},
    ).rowcount
    if changed != 1:
        raise LookupError(f"run {run_id} is no longer {status}")
    ordinal = 1  # a planned run has no segment yet
    if status != PLANNED:
        ordinal = conn.execute(sql.NEXT_ORDINAL, {"p_run_id": run_id}).scalar_one()
    segment_id = conn.execute(
        sql.INSERT_SEGMENT,
        {"run_id": run_id, "ordinal": ordinal, "start_step": start_step, "worker": worker,
         "resumed_from": resumed_from, "lease_token": lease},
    ).scalar_one()
    kind = "running" if status == PLANNED else "resumed"
    conn.execute(
        sql.INSERT_EVENT,
        {"campaign_id": campaign_id, "run_id": run_id, "kind": kind,
         "detail": f"{status} -> running, segment {ordinal}, worker {worker}"},
    )
    return Claim(run_id, segment_id, ordinal, config, worker, lease, start_step)
