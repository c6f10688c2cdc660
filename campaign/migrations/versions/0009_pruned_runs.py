"""Searches: the stop cause ``pruned`` and the one move it makes, interrupted -> stopped.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06

A search's run pauses at a rung (``interrupted``/``preempted``, checkpoint kept) until every
variant of the rung has reported; the recorded decision then either continues it (a resume,
as before) or prunes it: ``stopped`` with the cause ``pruned`` at the rung, its line kept
(docs/runs.md). The run is not running when that decision is taken, so the ledger allows
exactly this move besides the old ones, and only with that cause. The cause joins the CHECK on
``runs.stop_cause``; on SQLite by the documented ``writable_schema`` rewrite of 0003, 0005
and 0008, and the transition trigger is recreated; on PostgreSQL the constraint and the
status function are replaced. Frozen lists here, never the live vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REFUSED = "campaign ledger refused"
OLD_CAUSES = (
    "budget_reached", "non_finite_loss", "non_finite_grad", "loss_explosion", "early_stop",
    "wall_time", "out_of_memory", "exception", "interrupted", "preempted", "heartbeat_lost",
    "stalled", "killed", "ledger_unreachable",
)
NEW_CAUSES = (*OLD_CAUSES, "pruned")
TERMINAL = ("completed", "diverged", "stopped", "failed", "oom", "withdrawn")
ENDED = ("completed", "diverged", "stopped", "failed", "oom", "interrupted", "lost")
FINAL_ONCE_TERMINAL = (
    "status", "stop_cause", "stop_step", "stop_phase", "stop_detail", "started_at", "ended_at",
)
PRUNE = " OR (OLD.status = 'interrupted' AND NEW.status = 'stopped' AND NEW.stop_cause = 'pruned')"


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _transition_ok(pruned: bool) -> str:
    allowed = (
        "(OLD.status = 'planned' AND NEW.status = 'running')"
        f" OR (OLD.status = 'running' AND {_in('NEW.status', ENDED)})"
        " OR (OLD.status IN ('interrupted', 'lost') AND NEW.status = 'running')"
        " OR (OLD.status = 'planned' AND NEW.status = 'withdrawn')"
    )
    return allowed + (PRUNE if pruned else "")


def upgrade() -> None:
    _set_rules(NEW_CAUSES, OLD_CAUSES, pruned=True)


def downgrade() -> None:
    held = op.get_bind().execute(sa.text("SELECT count(*) FROM runs WHERE stop_cause = 'pruned'"))
    if held.scalar_one():
        raise RuntimeError(f"{REFUSED}: the ledger holds pruned runs; revision 0008 has no such "
                           "cause")
    _set_rules(OLD_CAUSES, NEW_CAUSES, pruned=False)


def _set_rules(causes: Sequence[str], before: Sequence[str], *, pruned: bool) -> None:
    bind = op.get_bind()
    check = f"stop_cause IS NULL OR {_in('stop_cause', causes)}"
    if bind.dialect.name == "postgresql":
        op.drop_constraint("ck_runs_stop_cause", "runs", type_="check")
        op.create_check_constraint("ck_runs_stop_cause", "runs", check)
        _postgresql_status_function(_transition_ok(pruned))
        return
    _rewrite_sqlite_check(_in("stop_cause", before), _in("stop_cause", causes))
    _sqlite_transition_trigger(_transition_ok(pruned))


def _rewrite_sqlite_check(old: str, new: str) -> None:
    bind = op.get_bind()
    stored = bind.execute(
        sa.text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'runs'")
    ).scalar_one()
    if stored.count(old) != 1:
        raise RuntimeError(f"{REFUSED}: runs table does not hold the stop-cause check once")
    version = bind.execute(sa.text("PRAGMA schema_version")).scalar_one()
    bind.exec_driver_sql("PRAGMA writable_schema = ON")
    try:
        bind.execute(
            sa.text("UPDATE sqlite_master SET sql = :sql WHERE type = 'table' AND name = 'runs'"),
            {"sql": stored.replace(old, new)},
        )
        bind.exec_driver_sql(f"PRAGMA schema_version = {int(version) + 1}")
    finally:
        bind.exec_driver_sql("PRAGMA writable_schema = OFF")
    problems = bind.execute(sa.text("PRAGMA integrity_check")).scalars().all()
    if problems != ["ok"]:
        raise RuntimeError(f"{REFUSED}: integrity check after the runs rewrite: {problems[:3]}")


def _sqlite_transition_trigger(transition_ok: str) -> None:
    message = (f"{REFUSED}: run status transition not allowed (planned -> running -> ended; "
               "interrupted or lost -> running; planned -> withdrawn; interrupted -> stopped "
               "when pruned)").replace("'", "''")
    op.execute("DROP TRIGGER runs_status_transition")
    op.execute(
        "CREATE TRIGGER runs_status_transition BEFORE UPDATE OF status ON runs FOR EACH ROW "
        f"WHEN NEW.status IS NOT OLD.status AND NOT ({transition_ok}) BEGIN "
        f"SELECT RAISE(ABORT, '{message}'); END"
    )


def _postgresql_status_function(transition_ok: str) -> None:
    final_changed = " OR ".join(f"NEW.{c} IS DISTINCT FROM OLD.{c}" for c in FINAL_ONCE_TERMINAL)
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION campaign_run_status() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF {_in("OLD.status", TERMINAL)} AND ({final_changed}) THEN
                RAISE EXCEPTION '{REFUSED}: run % is % and final (a terminal status is never left)',
                    OLD.id, OLD.status USING ERRCODE = 'restrict_violation';
            END IF;
            IF NEW.status IS DISTINCT FROM OLD.status AND NOT ({transition_ok}) THEN
                RAISE EXCEPTION '{REFUSED}: run % cannot go from % to %',
                    OLD.id, OLD.status, NEW.status USING ERRCODE = 'restrict_violation';
            END IF;
            RETURN NEW;
        END $$
        """
    )
