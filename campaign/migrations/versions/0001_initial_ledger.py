"""Initial ledger: every table of docs/ledger.md and the immutability triggers.

Revision ID: 0001
Revises:
Create Date: 2026-11-30

The triggers make the database itself refuse what a careful lab never does:
delete a run, a metric, an event, a measurement or an artifact; change a
run's identity or frozen configuration; leave a terminal status. Both engines
get the same rules from the tables below (a frozen copy: this file must keep
its meaning when the models change).

Note for later revisions: SQLite batch operations recreate a table and lose
its triggers; such a revision must recreate them (tests/ledger/test_immutability.py
runs every rule at head and would catch it).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REFUSED = "campaign ledger refused"
STATUSES = (
    "planned", "running", "completed", "diverged", "stopped", "failed", "oom", "interrupted", "lost",
)
TERMINAL = ("completed", "diverged", "stopped", "failed", "oom")
ENDED = (*TERMINAL, "interrupted", "lost")
STOP_CAUSES = (
    "budget_reached", "non_finite_loss", "non_finite_grad", "loss_explosion", "early_stop",
    "wall_time", "out_of_memory", "exception", "interrupted", "preempted", "heartbeat_lost",
)

# Nothing in the ledger is ever deleted.
NO_DELETE = (
    "campaigns", "variants", "runs", "segments", "metrics", "events",
    "phase_measurements", "artifacts", "pilots", "notes",
)
# Rows that are written once and never changed.
NO_UPDATE = (
    "campaigns", "variants", "metrics", "events", "phase_measurements", "artifacts", "notes",
)
# Columns that never change on tables whose other columns may.
FROZEN = {
    "runs": (
        "id", "campaign_id", "variant_id", "seed", "config", "config_sha256",
        "relaunch_of", "relaunch_reason", "created_at",
    ),
    "segments": ("id", "run_id", "ordinal", "start_step", "started_at", "resumed_from"),
    "pilots": ("id", "campaign_id", "config_sha256", "created_at"),
}
# Once a run is terminal these stay as they are.
FINAL_ONCE_TERMINAL = (
    "status", "stop_cause", "stop_step", "stop_phase", "stop_detail", "started_at", "ended_at",
)


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


TRANSITION_OK = (
    "(OLD.status = 'planned' AND NEW.status = 'running')"
    f" OR (OLD.status = 'running' AND {_in('NEW.status', ENDED)})"
    " OR (OLD.status IN ('interrupted', 'lost') AND NEW.status = 'running')"
)


def _now() -> sa.TextClause:
    """The database's UTC time with sub-second resolution (see ledger/dialects.py)."""
    if op.get_bind().dialect.name == "sqlite":
        return sa.text("(strftime('%Y-%m-%d %H:%M:%f', 'now'))")
    return sa.text("statement_timestamp()")


def _timestamp(name: str, nullable: bool = False) -> sa.Column:
    default = None if nullable else _now()
    return sa.Column(name, sa.DateTime(timezone=True), server_default=default, nullable=nullable)


def upgrade() -> None:
    _create_tables()
    if op.get_bind().dialect.name == "sqlite":
        _create_sqlite_triggers()
    else:
        _create_postgresql_triggers()


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in NO_DELETE:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table}")
        op.execute("DROP TRIGGER IF EXISTS runs_status_guard ON runs")
        for table in NO_DELETE:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_delete ON {table}")
        for table in NO_UPDATE:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_update ON {table}")
        for table in FROZEN:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_frozen_columns ON {table}")
        for function in ("campaign_refuse", "campaign_frozen_columns", "campaign_run_status"):
            op.execute(f"DROP FUNCTION IF EXISTS {function}()")
    for table in (
        "metrics", "segments", "phase_measurements", "events", "artifacts",
        "runs", "variants", "pilots", "notes", "campaigns",
    ):
        op.drop_table(table)  # SQLite drops a table's triggers with it


def _create_tables() -> None:
    op.create_table(
        "campaigns",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("spec_sha256", sa.String(64), nullable=False),
        sa.Column("task", sa.String(500), nullable=False),
        _timestamp("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_campaigns"),
        sa.UniqueConstraint("name", name="uq_campaigns_name"),
    )
    op.create_table(
        "notes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("campaign_id", sa.Integer(), nullable=False),
        _timestamp("at"),
        sa.Column("text", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["campaign_id"], ["campaigns.id"], name="fk_notes_campaign_id_campaigns"),
        sa.PrimaryKeyConstraint("id", name="pk_notes"),
    )
    op.create_index("ix_notes_campaign_id", "notes", ["campaign_id"])
    op.create_table(
        "pilots",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("campaign_id", sa.Integer(), nullable=False),
        sa.Column("config_sha256", sa.String(64), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=True),
        sa.Column("environment", sa.Text(), nullable=True),
        _timestamp("created_at"),
        sa.ForeignKeyConstraint(["campaign_id"], ["campaigns.id"], name="fk_pilots_campaign_id_campaigns"),
        sa.PrimaryKeyConstraint("id", name="pk_pilots"),
    )
    op.create_index("ix_pilots_campaign_id", "pilots", ["campaign_id"])
    op.create_table(
        "variants",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("campaign_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("is_control", sa.Boolean(), nullable=False),
        sa.Column("overrides", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["campaign_id"], ["campaigns.id"], name="fk_variants_campaign_id_campaigns"),
        sa.PrimaryKeyConstraint("id", name="pk_variants"),
        sa.UniqueConstraint("campaign_id", "name", name="uq_variants_campaign_id_name"),
    )
    op.create_index(
        "uq_variants_one_control", "variants", ["campaign_id"], unique=True,
        sqlite_where=sa.text("is_control"), postgresql_where=sa.text("is_control"),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("campaign_id", sa.Integer(), nullable=False),
        sa.Column("variant_id", sa.Integer(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("config", sa.Text(), nullable=False),
        sa.Column("config_sha256", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), server_default="planned", nullable=False),
        sa.Column("stop_cause", sa.String(32), nullable=True),
        sa.Column("stop_step", sa.BigInteger(), nullable=True),
        sa.Column("stop_phase", sa.String(32), nullable=True),
        sa.Column("stop_detail", sa.Text(), nullable=True),
        sa.Column("relaunch_of", sa.String(32), nullable=True),
        sa.Column("relaunch_reason", sa.Text(), nullable=True),
        sa.Column("environment", sa.Text(), nullable=True),
        _timestamp("created_at"),
        _timestamp("started_at", nullable=True),
        _timestamp("ended_at", nullable=True),
        sa.Column("worker", sa.String(200), nullable=True),
        _timestamp("heartbeat_at", nullable=True),
        sa.CheckConstraint(_in("status", STATUSES), name="ck_runs_status"),
        sa.CheckConstraint(f"stop_cause IS NULL OR {_in('stop_cause', STOP_CAUSES)}", name="ck_runs_stop_cause"),
        sa.CheckConstraint("(status IN ('planned', 'running')) = (stop_cause IS NULL)", name="ck_runs_stop_cause_iff_ended"),
        sa.CheckConstraint("relaunch_of IS NULL OR relaunch_reason IS NOT NULL", name="ck_runs_relaunch_has_reason"),
        sa.CheckConstraint("relaunch_of IS NULL OR relaunch_of <> id", name="ck_runs_relaunch_not_self"),
        sa.ForeignKeyConstraint(["campaign_id"], ["campaigns.id"], name="fk_runs_campaign_id_campaigns"),
        sa.ForeignKeyConstraint(["relaunch_of"], ["runs.id"], name="fk_runs_relaunch_of_runs"),
        sa.ForeignKeyConstraint(["variant_id"], ["variants.id"], name="fk_runs_variant_id_variants"),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
    )
    op.create_index("ix_runs_campaign_id_status", "runs", ["campaign_id", "status"])
    op.create_index("ix_runs_relaunch_of", "runs", ["relaunch_of"])
    op.create_table(
        "artifacts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=True),
        _timestamp("created_at"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_artifacts_run_id_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_artifacts"),
    )
    op.create_index("ix_artifacts_run_id", "artifacts", ["run_id"])
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("campaign_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(32), nullable=True),
        _timestamp("at"),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["campaign_id"], ["campaigns.id"], name="fk_events_campaign_id_campaigns"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_events_run_id_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
    )
    op.create_index("ix_events_campaign_id_run_id", "events", ["campaign_id", "run_id"])
    op.create_index("ix_events_run_id", "events", ["run_id"])
    op.create_table(
        "phase_measurements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(32), nullable=True),
        sa.Column("pilot_id", sa.Integer(), nullable=True),
        sa.Column("phase", sa.String(32), nullable=False),
        sa.Column("device", sa.String(64), nullable=False),
        sa.Column("inputs", sa.Text(), nullable=True),
        *(sa.Column(name, sa.BigInteger(), nullable=True) for name in (
            "allocated", "allocated_peak", "reserved", "reserved_peak",
            "baseline_allocated", "rss", "rss_peak",
        )),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("verdict", sa.String(16), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        _timestamp("at"),
        sa.CheckConstraint("(run_id IS NULL) <> (pilot_id IS NULL)", name="ck_phase_measurements_run_xor_pilot"),
        sa.ForeignKeyConstraint(["pilot_id"], ["pilots.id"], name="fk_phase_measurements_pilot_id_pilots"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_phase_measurements_run_id_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_phase_measurements"),
    )
    op.create_index("ix_phase_measurements_pilot_id", "phase_measurements", ["pilot_id"])
    op.create_index("ix_phase_measurements_run_id", "phase_measurements", ["run_id"])
    op.create_table(
        "segments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("start_step", sa.BigInteger(), nullable=False),
        sa.Column("end_step", sa.BigInteger(), nullable=True),
        sa.Column("worker", sa.String(200), nullable=True),
        _timestamp("started_at"),
        _timestamp("ended_at", nullable=True),
        sa.Column("resumed_from", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["resumed_from"], ["artifacts.id"], name="fk_segments_resumed_from_artifacts"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_segments_run_id_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_segments"),
        sa.UniqueConstraint("run_id", "id", name="uq_segments_run_id_id"),
        sa.UniqueConstraint("run_id", "ordinal", name="uq_segments_run_id_ordinal"),
    )
    op.create_table(
        "metrics",
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("segment_id", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("examples_seen", sa.BigInteger(), nullable=True),
        sa.Column("wall_time", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id", "segment_id"], ["segments.run_id", "segments.id"],
            name="fk_metrics_run_id_segment_id_segments",
        ),
        sa.PrimaryKeyConstraint("run_id", "key", "step", "segment_id", name="pk_metrics"),
        sqlite_with_rowid=False,
    )


def _sqlite_raise(message: str) -> str:
    return "SELECT RAISE(ABORT, '" + f"{REFUSED}: {message}".replace("'", "''") + "');"


def _create_sqlite_triggers() -> None:
    for table in NO_DELETE:
        op.execute(
            f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} BEGIN "
            + _sqlite_raise(f"rows of {table} are never deleted")
            + " END"
        )
    for table in NO_UPDATE:
        op.execute(
            f"CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table} BEGIN "
            + _sqlite_raise(f"rows of {table} are written once and never changed")
            + " END"
        )
    for table, columns in FROZEN.items():
        changed = " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in columns)
        op.execute(
            f"CREATE TRIGGER {table}_frozen_columns BEFORE UPDATE ON {table} "
            f"FOR EACH ROW WHEN {changed} BEGIN "
            + _sqlite_raise(f"frozen columns of {table} cannot change ({', '.join(columns)})")
            + " END"
        )
    final_changed = " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in FINAL_ONCE_TERMINAL)
    op.execute(
        "CREATE TRIGGER runs_terminal_final BEFORE UPDATE ON runs FOR EACH ROW "
        f"WHEN {_in('OLD.status', TERMINAL)} AND ({final_changed}) BEGIN "
        + _sqlite_raise(
            "a run in a terminal status (completed, diverged, stopped, failed, oom) is final"
        )
        + " END"
    )
    op.execute(
        "CREATE TRIGGER runs_status_transition BEFORE UPDATE OF status ON runs FOR EACH ROW "
        f"WHEN NEW.status IS NOT OLD.status AND NOT ({TRANSITION_OK}) BEGIN "
        + _sqlite_raise(
            "run status transition not allowed (planned -> running -> ended; "
            "interrupted or lost -> running)"
        )
        + " END"
    )


def _create_postgresql_triggers() -> None:
    op.execute(
        f"""
        CREATE FUNCTION campaign_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION '{REFUSED}: %', TG_ARGV[0] USING ERRCODE = 'restrict_violation';
        END $$
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION campaign_frozen_columns() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            col text;
        BEGIN
            FOREACH col IN ARRAY TG_ARGV LOOP
                IF to_jsonb(NEW) -> col IS DISTINCT FROM to_jsonb(OLD) -> col THEN
                    RAISE EXCEPTION '{REFUSED}: frozen column %.% cannot change (row %)',
                        TG_TABLE_NAME, col, to_jsonb(OLD) ->> 'id'
                        USING ERRCODE = 'restrict_violation';
                END IF;
            END LOOP;
            RETURN NEW;
        END $$
        """
    )
    final_changed = " OR ".join(f"NEW.{c} IS DISTINCT FROM OLD.{c}" for c in FINAL_ONCE_TERMINAL)
    op.execute(
        f"""
        CREATE FUNCTION campaign_run_status() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF {_in("OLD.status", TERMINAL)} AND ({final_changed}) THEN
                RAISE EXCEPTION '{REFUSED}: run % is % and final (a terminal status is never left)',
                    OLD.id, OLD.status USING ERRCODE = 'restrict_violation';
            END IF;
            IF NEW.status IS DISTINCT FROM OLD.status AND NOT ({TRANSITION_OK}) THEN
                RAISE EXCEPTION '{REFUSED}: run % cannot go from % to %',
                    OLD.id, OLD.status, NEW.status USING ERRCODE = 'restrict_violation';
            END IF;
            RETURN NEW;
        END $$
        """
    )
    for table in NO_DELETE:
        op.execute(
            f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} FOR EACH ROW "
            f"EXECUTE FUNCTION campaign_refuse('rows of {table} are never deleted')"
        )
        op.execute(
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} FOR EACH STATEMENT "
            f"EXECUTE FUNCTION campaign_refuse('{table} is never truncated')"
        )
    for table in NO_UPDATE:
        op.execute(
            f"CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table} FOR EACH ROW "
            f"EXECUTE FUNCTION campaign_refuse('rows of {table} are written once and never changed')"
        )
    for table, columns in FROZEN.items():
        arguments = ", ".join(f"'{c}'" for c in columns)
        op.execute(
            f"CREATE TRIGGER {table}_frozen_columns BEFORE UPDATE ON {table} FOR EACH ROW "
            f"EXECUTE FUNCTION campaign_frozen_columns({arguments})"
        )
    op.execute(
        "CREATE TRIGGER runs_status_guard BEFORE UPDATE ON runs FOR EACH ROW "
        "EXECUTE FUNCTION campaign_run_status()"
    )
