"""A search's steps written once: a rung's decisions, a cohort's proposals, the confirmation.

Every worker of a search may find the same step due at the same moment (campaign/search/
decides it from what the ledger holds, the same answer for each). The step is written in one
transaction under its key, and a key written before makes the write a no-op: one worker's
step is kept, and the others read it. On PostgreSQL the campaign's row is locked first
(``FOR NO KEY UPDATE``: the rows that reference it, events and runs, are still written
meanwhile), so two steps never interleave; SQLite's write transactions are one at a
time already.

A pruned run leaves ``interrupted`` (paused at its rung) for ``stopped`` with the cause
``pruned``: the one move the ledger allows a run that is not running (revision 0009).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, insert, select, text

from campaign.errors import IllegalTransition
from campaign.ledger import statements as sql
from campaign.ledger.canonical import canonical_json, sha256_text
from campaign.ledger.connections import Done
from campaign.ledger.evidence import record_event
from campaign.ledger.ids import new_run_id
from campaign.ledger.models import Event, Variant

STEP_KIND = "search_step"
events_t, variants_t = Event.__table__, Variant.__table__


@dataclass(frozen=True)
class Pruning:
    run_id: str
    step: int
    detail: str


@dataclass(frozen=True)
class SearchStep:
    """What one step writes: ``events`` (run id or None, kind, detail), runs to prune, new
    variants (name, overrides) and new planned runs (variant, seed, config)."""

    key: str
    events: Sequence[tuple[str | None, str, str]] = ()
    prune: Sequence[Pruning] = ()
    variants: Sequence[tuple[str, dict[str, Any]]] = ()
    runs: Sequence[tuple[str, int, dict[str, Any]]] = field(default_factory=tuple)


def step_taken(conn: Connection, campaign_id: int, key: str) -> bool:
    return conn.execute(select(events_t.c.id).where(
        events_t.c.campaign_id == campaign_id, events_t.c.kind == STEP_KIND,
        events_t.c.detail == key)).first() is not None


def record_step(ledger: Any, campaign: str, step: SearchStep) -> bool:
    """Write ``step`` unless its key was written before; True when this call wrote it."""
    planned = [(new_run_id(), variant, seed, canonical_json(config))
               for variant, seed, config in step.runs]

    def work(conn: Connection) -> bool:
        campaign_id = ledger._campaign_id(conn, campaign)
        if conn.dialect.name == "postgresql":  # one step at a time per campaign
            conn.execute(text("SELECT id FROM campaigns WHERE id = :id FOR NO KEY UPDATE"),
                         {"id": campaign_id})
        if step_taken(conn, campaign_id, step.key):
            return False
        record_event(conn, campaign_id, None, STEP_KIND, step.key)
        for name, overrides in step.variants:
            conn.execute(insert(variants_t).values(
                campaign_id=campaign_id, name=name, is_control=False,
                overrides=canonical_json(overrides)))
        for run_id, kind, detail in step.events:
            record_event(conn, campaign_id, run_id, kind, detail)
        for run_id, variant, seed, config in planned:
            variant_id = conn.execute(sql.VARIANT_ID, {"p_campaign_id": campaign_id,
                                                       "p_name": variant}).scalar_one()
            conn.execute(sql.INSERT_RUN, {
                "id": run_id, "campaign_id": campaign_id, "variant_id": variant_id,
                "seed": seed, "config": config, "config_sha256": sha256_text(config),
                "relaunch_of": None, "relaunch_reason": None})
            record_event(conn, campaign_id, run_id, "planned",
                         f"variant {variant}, seed {seed} (search: {step.key})")
        for pruning in step.prune:
            detail = f"interrupted -> stopped: pruned at step {pruning.step}: {pruning.detail}"
            record_event(conn, campaign_id, pruning.run_id, "stopped", detail)
            changed = conn.execute(sql.END_RUN, {
                "p_run_id": pruning.run_id, "p_old_status": "interrupted", "p_status": "stopped",
                "p_stop_cause": "pruned", "p_stop_step": pruning.step,
                "p_stop_phase": "validation", "p_stop_detail": pruning.detail,
                "p_lease": None}).rowcount
            if changed != 1:  # resumed meanwhile: nothing of the step is written
                raise IllegalTransition(f"run {pruning.run_id} left its rung while the search's "
                                        f"step {step.key} was being written")
        return True

    def settled(conn: Connection) -> Done[bool] | None:
        campaign_id = ledger._campaign_id(conn, campaign)
        return Done(True) if step_taken(conn, campaign_id, step.key) else None

    return bool(ledger._write(work, f"recording the search's step {step.key}", settled))
