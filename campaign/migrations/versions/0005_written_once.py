"""Written once, closed once ended: the gaps the immutability triggers of 0001 left open.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30

Tried by raw SQL on a completed run, 0001 let through: rewriting a run's
environment, moving a segment's end, turning a failed pilot into a passed one
(which opened the launch gate), and adding a metric, artifact, measurement or
event to a run that had ended (a ``val/accuracy`` of 1.0 at step 999 of a
4-update run became its final metric). Both engines now refuse:

- ``runs.environment`` once written;
- a segment's ``end_step``, ``ended_at``, ``training_s``, ``worker`` and
  ``lease_token`` once it has ended;
- ``pilots.verdict`` once written (NULL is a pilot still running);
- a row of ``metrics``, ``artifacts``, ``phase_measurements`` or ``events``
  for a run in a terminal status, and a metric for an ended segment.

What a run records at its end (its ``completed`` event, its last checkpoint,
final artifact, log) is written before the status changes, in the same
transaction or earlier, so it is not refused. The stop cause ``stalled`` (the
supervisor's, docs/processes.md) joins the CHECK on ``runs.stop_cause``; on
SQLite by the same documented ``writable_schema`` rewrite as 0003.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REFUSED = "campaign ledger refused"
TERMINAL = ("completed", "diverged", "stopped", "failed", "oom", "withdrawn")
OLD_CAUSES = (
    "budget_reached", "non_finite_loss", "non_finite_grad", "loss_explosion", "early_stop",
    "wall_time", "out_of_memory", "exception", "interrupted", "preempted", "heartbeat_lost",
)
NEW_CAUSES = (*OLD_CAUSES, "stalled")
SEGMENT_END = ("end_step", "ended_at", "training_s", "worker", "lease_token")
RUN_TABLES = ("artifacts", "phase_measurements", "events")  # and metrics, by its segment


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _cause_check(causes: Sequence[str]) -> str:
    return f"stop_cause IS NULL OR {_in('stop_cause', causes)}"


def upgrade() -> None:
    _set_causes(NEW_CAUSES, OLD_CAUSES)
    if op.get_bind().dialect.name == "sqlite":
        _sqlite_triggers()
    else:
        _postgresql_triggers()


def downgrade() -> None:
    bind = op.get_bind()
    stalled = bind.execute(sa.text("SELECT count(*) FROM runs WHERE stop_cause = 'stalled'"))
    if stalled.scalar_one():
        raise RuntimeError(f"{REFUSED}: the ledger holds stalled runs; revision 0004 has no such cause")
    if bind.dialect.name == "sqlite":
        for name in _sqlite_trigger_names():
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    else:
        for table, name in _postgresql_trigger_names():
            op.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
        for function in ("campaign_run_open", "campaign_segment_open", "campaign_written_once",
                         "campaign_run_end_closes_segments"):
            op.execute(f"DROP FUNCTION IF EXISTS {function}()")
    _set_causes(OLD_CAUSES, NEW_CAUSES)


def _set_causes(causes: Sequence[str], before: Sequence[str]) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint("ck_runs_stop_cause", "runs", type_="check")
        op.create_check_constraint("ck_runs_stop_cause", "runs", _cause_check(causes))
        return
    bind = op.get_bind()
    stored = bind.execute(
        sa.text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'runs'")
    ).scalar_one()
    old, new = _in("stop_cause", before), _in("stop_cause", causes)
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


def _sqlite_raise(message: str) -> str:
    return "SELECT RAISE(ABORT, '" + f"{REFUSED}: {message}".replace("'", "''") + "');"


def _sqlite_trigger_names() -> list[str]:
    return ["runs_environment_once", "segments_end_once", "pilots_verdict_once", "metrics_open",
            "runs_end_closes_segments", *(f"{t}_run_open" for t in RUN_TABLES)]


def _sqlite_triggers() -> None:
    op.execute(
        "CREATE TRIGGER runs_environment_once BEFORE UPDATE OF environment ON runs FOR EACH ROW "
        "WHEN OLD.environment IS NOT NULL AND NEW.environment IS NOT OLD.environment BEGIN "
        + _sqlite_raise("a run's environment is written once") + " END"
    )
    changed = " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in SEGMENT_END)
    op.execute(
        "CREATE TRIGGER segments_end_once BEFORE UPDATE ON segments FOR EACH ROW "
        f"WHEN OLD.ended_at IS NOT NULL AND ({changed}) BEGIN "
        + _sqlite_raise("a segment's end is written once") + " END"
    )
    op.execute(
        "CREATE TRIGGER pilots_verdict_once BEFORE UPDATE OF verdict ON pilots FOR EACH ROW "
        "WHEN OLD.verdict IS NOT NULL AND NEW.verdict IS NOT OLD.verdict BEGIN "
        + _sqlite_raise("a pilot's verdict is written once, when the pilot ends") + " END"
    )
    for table in RUN_TABLES:
        op.execute(
            f"CREATE TRIGGER {table}_run_open BEFORE INSERT ON {table} FOR EACH ROW "
            "WHEN NEW.run_id IS NOT NULL AND "
            f"(SELECT status FROM runs WHERE id = NEW.run_id) IN ({', '.join(map(repr, TERMINAL))}) "
            "BEGIN " + _sqlite_raise(f"no {table} row is added to a run that has ended") + " END"
        )
    # The high-volume table: one primary-key lookup a row (its segment). A terminal run has
    # no open segment (next trigger), so an open segment means a run that has not ended.
    op.execute(
        "CREATE TRIGGER metrics_open BEFORE INSERT ON metrics FOR EACH ROW "
        "WHEN (SELECT ended_at FROM segments WHERE id = NEW.segment_id) IS NOT NULL BEGIN "
        + _sqlite_raise("no metrics row is added to a segment that has ended (or its run)")
        + " END"
    )
    op.execute(
        "CREATE TRIGGER runs_end_closes_segments BEFORE UPDATE OF status ON runs FOR EACH ROW "
        f"WHEN NEW.status IN ({', '.join(map(repr, TERMINAL))}) AND EXISTS (SELECT 1 FROM "
        "segments WHERE run_id = NEW.id AND ended_at IS NULL) BEGIN "
        + _sqlite_raise("a run ends after its open segment (end the segment first)") + " END"
    )


def _postgresql_trigger_names() -> list[tuple[str, str]]:
    return [("runs", "runs_environment_once"), ("segments", "segments_end_once"),
            ("pilots", "pilots_verdict_once"), ("metrics", "metrics_open"),
            ("runs", "runs_end_closes_segments"),
            *((t, f"{t}_run_open") for t in RUN_TABLES)]


def _postgresql_triggers() -> None:
    op.execute(
        f"""
        CREATE FUNCTION campaign_written_once() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            col text;
        BEGIN
            -- TG_ARGV[0]: the column whose non-null value marks the row as written;
            -- the rest: the columns that may not change after that.
            IF to_jsonb(OLD) -> TG_ARGV[0] IS NULL OR to_jsonb(OLD) -> TG_ARGV[0] = 'null'::jsonb THEN
                RETURN NEW;
            END IF;
            FOREACH col IN ARRAY TG_ARGV[1:] LOOP
                IF to_jsonb(NEW) -> col IS DISTINCT FROM to_jsonb(OLD) -> col THEN
                    RAISE EXCEPTION '{REFUSED}: %.% is written once (row %)',
                        TG_TABLE_NAME, col, to_jsonb(OLD) ->> 'id'
                        USING ERRCODE = 'restrict_violation';
                END IF;
            END LOOP;
            RETURN NEW;
        END $$
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION campaign_run_open() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.run_id IS NOT NULL AND EXISTS (
                SELECT 1 FROM runs WHERE id = NEW.run_id AND {_in("status", TERMINAL)}
            ) THEN
                RAISE EXCEPTION '{REFUSED}: no % row is added to run %, which has ended',
                    TG_TABLE_NAME, NEW.run_id USING ERRCODE = 'restrict_violation';
            END IF;
            RETURN NEW;
        END $$
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION campaign_segment_open() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF EXISTS (SELECT 1 FROM segments WHERE id = NEW.segment_id
                       AND ended_at IS NOT NULL) THEN
                RAISE EXCEPTION '{REFUSED}: no metrics row is added to segment %, which has '
                    'ended (or its run)', NEW.segment_id USING ERRCODE = 'restrict_violation';
            END IF;
            RETURN NEW;
        END $$
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION campaign_run_end_closes_segments() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF {_in("NEW.status", TERMINAL)} AND EXISTS (
                SELECT 1 FROM segments WHERE run_id = NEW.id AND ended_at IS NULL
            ) THEN
                RAISE EXCEPTION '{REFUSED}: run % ends after its open segment (end the segment '
                    'first)', NEW.id USING ERRCODE = 'restrict_violation';
            END IF;
            RETURN NEW;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER runs_environment_once BEFORE UPDATE OF environment ON runs FOR EACH ROW "
        "EXECUTE FUNCTION campaign_written_once('environment', 'environment')"
    )
    segment_end = ", ".join(f"'{c}'" for c in SEGMENT_END)
    op.execute(
        f"CREATE TRIGGER segments_end_once BEFORE UPDATE OF {', '.join(SEGMENT_END)} ON segments "
        f"FOR EACH ROW EXECUTE FUNCTION campaign_written_once('ended_at', {segment_end})"
    )
    op.execute(
        "CREATE TRIGGER pilots_verdict_once BEFORE UPDATE OF verdict ON pilots FOR EACH ROW "
        "EXECUTE FUNCTION campaign_written_once('verdict', 'verdict')"
    )
    for table in RUN_TABLES:
        op.execute(
            f"CREATE TRIGGER {table}_run_open BEFORE INSERT ON {table} FOR EACH ROW "
            "EXECUTE FUNCTION campaign_run_open()"
        )
    op.execute(
        "CREATE TRIGGER metrics_open BEFORE INSERT ON metrics FOR EACH ROW "
        "EXECUTE FUNCTION campaign_segment_open()"
    )
    op.execute(
        "CREATE TRIGGER runs_end_closes_segments BEFORE UPDATE OF status ON runs FOR EACH ROW "
        "EXECUTE FUNCTION campaign_run_end_closes_segments()"
    )
