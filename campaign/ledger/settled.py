"""Whether a write whose COMMIT was lost with its connection had taken effect.

An outage can cut a connection while its COMMIT is on the wire: the write may or may not be
in the database, and the retry (connections.run_in_transaction) must not do it twice — two
claims of one run, a run's end refused as a lost lease, an event written twice. Each check
here recognises one write by what only that write could have left: a claim by its fresh
lease token, a run's end by its status and stop under that lease, a new row by its values
past the highest id the first attempt saw (its "mark").
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Table, func, select

from campaign.ledger.connections import Done
from campaign.ledger.models import Artifact, Event, Run, Segment
from campaign.ledger.records import Claim, StopRecord
from campaign.ledger.vocabulary import RUNNING

runs_t, segments_t = Run.__table__, Segment.__table__
events_t, artifacts_t = Event.__table__, Artifact.__table__


def claim_under(conn: Connection, lease: str) -> Done[Claim] | None:
    """The claim made with ``lease`` (a token drawn for that claim alone), if it committed."""
    row = conn.execute(
        select(segments_t.c.id, segments_t.c.ordinal, segments_t.c.worker, runs_t.c.id.label("run"),
               runs_t.c.config, segments_t.c.start_step)
        .join(runs_t, runs_t.c.id == segments_t.c.run_id)
        .where(segments_t.c.lease_token == lease, runs_t.c.lease_token == lease,
               runs_t.c.status == RUNNING, segments_t.c.ended_at.is_(None))
    ).first()
    if row is None:
        return None
    return Done(Claim(row.run, row.id, row.ordinal, row.config, row.worker, lease,
                      row.start_step))


def ended_as(conn: Connection, run_id: str, status: str, stop: StopRecord,
             lease: str | None) -> Done[None] | None:
    """The run ended already with this status and stop (under ``lease`` when given)."""
    row = conn.execute(
        select(runs_t.c.status, runs_t.c.stop_cause, runs_t.c.stop_step, runs_t.c.lease_token)
        .where(runs_t.c.id == run_id)
    ).first()
    if row is None or (row.status, row.stop_cause, row.stop_step) != (status, stop.cause,
                                                                      stop.step):
        return None
    return Done(None) if lease is None or row.lease_token == lease else None


def run_there(conn: Connection, run_id: str) -> Done[str] | None:
    """The run ``run_id`` (an id drawn for that plan alone) exists."""
    found = conn.execute(select(runs_t.c.id).where(runs_t.c.id == run_id)).scalar()
    return None if found is None else Done(run_id)


def last_id(conn: Connection, table: Table) -> int:
    """The highest id of ``table`` now: the mark a new row's check looks past."""
    return int(conn.execute(select(func.max(table.c.id))).scalar() or 0)


def row_past(conn: Connection, table: Table, mark: int, **values: Any) -> Done[int] | None:
    """A row of ``table`` past ``mark`` with exactly ``values`` (its id), if one committed."""
    found = conn.execute(
        select(table.c.id).where(table.c.id > mark,
                                 *(table.c[k].is_(None) if v is None else table.c[k] == v
                                   for k, v in values.items()))
        .order_by(table.c.id).limit(1)
    ).scalar()
    return None if found is None else Done(int(found))
