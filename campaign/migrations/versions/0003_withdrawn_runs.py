"""Withdrawn runs, and each segment's training time apart from its overhead.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

``withdrawn`` is a new terminal status: a planned run that will never
execute (planned by mistake). The database allows it only from ``planned``;
like every terminal status it is final. A withdrawn run has no stop cause
(it never started), so the check "stop cause iff ended" learns the word too.

``segments.training_s`` holds the seconds a segment spent in updates and
validation; the rest of its wall time (start-up, checkpoints, export,
replay) is overhead. Plain ``ADD COLUMN``.

SQLite cannot alter a CHECK constraint, and copying ``runs`` to a new table
would need foreign keys switched off outside the migration's transaction.
So the constraint text is rewritten in place, the procedure SQLite documents
for loosening a CHECK ("Making Other Kinds Of Table Schema Changes":
``writable_schema``, bump ``schema_version``, ``integrity_check``), inside
the same locked transaction as every other migration. Loosening is safe:
every existing row satisfies the wider check.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REFUSED = "campaign ledger refused"
OLD_STATUSES = (
    "planned", "running", "completed", "diverged", "stopped", "failed", "oom", "interrupted", "lost",
)
NEW_STATUSES = (*OLD_STATUSES, "withdrawn")
OLD_TERMINAL = ("completed", "diverged", "stopped", "failed", "oom")
NEW_TERMINAL = (*OLD_TERMINAL, "withdrawn")
ENDED = (*OLD_TERMINAL, "interrupted", "lost")
OLD_NOT_ENDED = "(status IN ('planned', 'running')) = (stop_cause IS NULL)"
NEW_NOT_ENDED = "(status IN ('planned', 'running', 'withdrawn')) = (stop_cause IS NULL)"
FINAL_ONCE_TERMINAL = (
    "status", "stop_cause", "stop_step", "stop_phase", "stop_detail", "started_at", "ended_at",
)


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _transition_ok(withdrawn: bool) -> str:
    allowed = (
        "(OLD.status = 'planned' AND NEW.status = 'running')"
        f" OR (OLD.status = 'running' AND {_in('NEW.status', ENDED)})"
        " OR (OLD.status IN ('interrupted', 'lost') AND NEW.status = 'running')"
    )
    return allowed + (" OR (OLD.status = 'planned' AND NEW.status = 'withdrawn')" if withdrawn else "")


def upgrade() -> None:
    op.add_column("segments", sa.Column("training_s", sa.Float(), nullable=True))
    _set_status_rules(withdrawn=True)


def downgrade() -> None:
    count = op.get_bind().execute(sa.text("SELECT count(*) FROM runs WHERE status = 'withdrawn'"))
    if count.scalar_one():
        raise RuntimeError(
            f"{REFUSED}: the ledger holds withdrawn runs; revision 0002 has no such status"
        )
    _set_status_rules(withdrawn=False)
    op.drop_column("segments", "training_s")


def _set_status_rules(withdrawn: bool) -> None:
    statuses, not_ended = (NEW_STATUSES, NEW_NOT_ENDED) if withdrawn else (OLD_STATUSES, OLD_NOT_ENDED)
    terminal = NEW_TERMINAL if withdrawn else OLD_TERMINAL
    if op.get_bind().dialect.name == "sqlite":
        before = (OLD_STATUSES, OLD_NOT_ENDED) if withdrawn else (NEW_STATUSES, NEW_NOT_ENDED)
        _rewrite_sqlite_checks({_in("status", before[0]): _in("status", statuses),
                                before[1]: not_ended})
        _sqlite_status_triggers(terminal, _transition_ok(withdrawn))
    else:
        op.drop_constraint("ck_runs_status", "runs", type_="check")
        op.create_check_constraint("ck_runs_status", "runs", _in("status", statuses))
        op.drop_constraint("ck_runs_stop_cause_iff_ended", "runs", type_="check")
        op.create_check_constraint("ck_runs_stop_cause_iff_ended", "runs", not_ended)
        _postgresql_status_function(terminal, _transition_ok(withdrawn))


def _rewrite_sqlite_checks(replacements: dict[str, str]) -> None:
    """Replace CHECK texts in the stored CREATE TABLE of ``runs`` (SQLite's documented way)."""
    bind = op.get_bind()
    stored = bind.execute(
        sa.text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'runs'")
    ).scalar_one()
    rewritten = stored
    for old, new in replacements.items():
        if rewritten.count(old) != 1:
            raise RuntimeError(f"{REFUSED}: runs table does not hold the check {old!r} once")
        rewritten = rewritten.replace(old, new)
    version = bind.execute(sa.text("PRAGMA schema_version")).scalar_one()
    bind.exec_driver_sql("PRAGMA writable_schema = ON")
    try:
        bind.execute(
            sa.text("UPDATE sqlite_master SET sql = :sql WHERE type = 'table' AND name = 'runs'"),
            {"sql": rewritten},
        )
        bind.exec_driver_sql(f"PRAGMA schema_version = {int(version) + 1}")
    finally:
        bind.exec_driver_sql("PRAGMA writable_schema = OFF")
    problems = bind.execute(sa.text("PRAGMA integrity_check")).scalars().all()
    if problems != ["ok"]:
        raise RuntimeError(f"{REFUSED}: integrity check after the runs rewrite: {problems[:3]}")


def _sqlite_raise(message: str) -> str:
    return "SELECT RAISE(ABORT, '" + f"{REFUSED}: {message}".replace("'", "''") + "');"


def _sqlite_status_triggers(terminal: Sequence[str], transition_ok: str) -> None:
    op.execute("DROP TRIGGER runs_terminal_final")
    op.execute("DROP TRIGGER runs_status_transition")
    final_changed = " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in FINAL_ONCE_TERMINAL)
    op.execute(
        "CREATE TRIGGER runs_terminal_final BEFORE UPDATE ON runs FOR EACH ROW "
        f"WHEN {_in('OLD.status', terminal)} AND ({final_changed}) BEGIN "
        + _sqlite_raise(f"a run in a terminal status ({', '.join(terminal)}) is final")
        + " END"
    )
    op.execute(
        "CREATE TRIGGER runs_status_transition BEFORE UPDATE OF status ON runs FOR EACH ROW "
        f"WHEN NEW.status IS NOT OLD.status AND NOT ({transition_ok}) BEGIN "
        + _sqlite_raise(
            "run status transition not allowed (planned -> running -> ended; "
            "interrupted or lost -> running"
            + ("; planned -> withdrawn)" if "withdrawn" in terminal else ")")
        )
        + " END"
    )


def _postgresql_status_function(terminal: Sequence[str], transition_ok: str) -> None:
    final_changed = " OR ".join(f"NEW.{c} IS DISTINCT FROM OLD.{c}" for c in FINAL_ONCE_TERMINAL)
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION campaign_run_status() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF {_in("OLD.status", terminal)} AND ({final_changed}) THEN
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
