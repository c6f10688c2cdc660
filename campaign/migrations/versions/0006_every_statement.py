"""Written once against every statement: REPLACE, forged inserts, a second original run.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02

Tried by raw SQL after 0005, the database still let through:

- on SQLite, ``INSERT OR REPLACE`` (and ``REPLACE``) onto an existing key of
  any protected table: REPLACE deletes the old row without firing delete
  triggers (unless the connection turned ``PRAGMA recursive_triggers`` on,
  which is per connection and so no rule), so a failed run became a
  completed one, a note or an event was rewritten. A ``BEFORE INSERT``
  trigger per unique key now refuses a row whose key exists, whatever the
  statement's conflict clause. One exception keeps the metric writer's
  retried flush idempotent (``ON CONFLICT DO NOTHING``): a metric row
  with the stored value (and examples seen) is ignored, one with another
  value is refused;
- a ``segments`` row for a run that is not ``running`` (a completed run
  took a new segment, and a metric through it changed what the API read);
- a run inserted in any status but ``planned`` (or already started,
  ended, placed or marked);
- a second original run (no ``relaunch_of``) for a (variant, seed): the
  counting rules pair seeds by it. A partial unique index holds it now. An
  older ledger that holds such runs (written through raw SQL or an early
  API) is migrated by *marking* the later ones, never deleting:
  ``runs.duplicate_of`` names the first original, a campaign-level
  ``duplicate_original`` event says so, and the report gives the marked run
  its line without counting it. ``duplicate_of`` is written by this
  migration only.

PostgreSQL has no REPLACE; its ``INSERT ... ON CONFLICT DO UPDATE`` fires the
update triggers of 0001 and 0005, which already refuse.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REFUSED = "campaign ledger refused"
ONE_ORIGINAL = "uq_runs_one_original"
ORIGINAL_WHERE = "relaunch_of IS NULL AND duplicate_of IS NULL"
# Every unique key of every protected table at this revision (a frozen copy).
UNIQUE_KEYS: dict[str, tuple[tuple[str, ...], ...]] = {
    "campaigns": (("id",), ("name",)),
    "variants": (("id",), ("campaign_id", "name")),
    "runs": (("id",),),
    "segments": (("id",), ("run_id", "ordinal")),
    "events": (("id",),),
    "phase_measurements": (("id",),),
    "artifacts": (("id",),),
    "pilots": (("id",),),
    "notes": (("id",),),
}
# The partial unique indexes, as the condition under which a new row would collide (found
# by review: REPLACE of a second control deleted the first).
PARTIAL_KEYS = {
    "variants": "NEW.is_control AND EXISTS (SELECT 1 FROM variants WHERE variants.campaign_id "
                "= NEW.campaign_id AND variants.is_control)",
}
METRIC_KEY = ("run_id", "key", "step", "segment_id")
METRIC_VALUES = ("value", "examples_seen")  # a retry logs the same point at a later wall time
# What a planned run has not got yet: a run is inserted planned and empty.
NOT_AT_INSERT = ("started_at", "ended_at", "worker", "heartbeat_at", "lease_token",
                 "environment", "stop_step", "stop_phase", "stop_detail", "duplicate_of")


def _sqlite_raise(message: str) -> str:
    return f"SELECT {_sqlite_raise_value(message)};"


def _match(table: str, columns: Sequence[str]) -> str:
    return " AND ".join(f"{table}.{c} = NEW.{c}" for c in columns)


def upgrade() -> None:
    op.add_column("runs", sa.Column("duplicate_of", sa.String(32), nullable=True))
    _mark_duplicates()
    op.create_index(ONE_ORIGINAL, "runs", ["variant_id", "seed"], unique=True,
                    sqlite_where=sa.text(ORIGINAL_WHERE),
                    postgresql_where=sa.text(ORIGINAL_WHERE))
    if op.get_bind().dialect.name == "sqlite":
        _sqlite_triggers()
    else:
        _postgresql_triggers()


def downgrade() -> None:
    bind = op.get_bind()
    marked = bind.execute(sa.text("SELECT count(*) FROM runs WHERE duplicate_of IS NOT NULL"))
    if marked.scalar_one():
        raise RuntimeError(f"{REFUSED}: the ledger marks duplicate originals; revision 0005 "
                           "has no place for the mark")
    if bind.dialect.name == "sqlite":
        for name in _sqlite_trigger_names():
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
        op.execute(METRICS_OPEN_0005)
    else:
        for table, name in _postgresql_trigger_names():
            op.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
        for function in ("campaign_run_inserted_planned", "campaign_segment_of_running_run",
                         "campaign_duplicate_of_once", "campaign_one_original"):
            op.execute(f"DROP FUNCTION IF EXISTS {function}()")
    op.drop_index(ONE_ORIGINAL, "runs")
    # Native on both engines (SQLite 3.35+): no table rebuild, so no trigger of 0001-0005 is lost.
    op.execute("ALTER TABLE runs DROP COLUMN duplicate_of")


def _mark_duplicates() -> None:
    """Mark every original after the first of its (variant, seed); nothing is deleted."""
    bind = op.get_bind()
    rows = bind.execute(sa.text(
        "SELECT id, campaign_id, variant_id, seed FROM runs WHERE relaunch_of IS NULL "
        "ORDER BY variant_id, seed, created_at, id"
    )).all()
    first: dict[tuple[int, int], str] = {}
    for run_id, campaign_id, variant_id, seed in rows:
        original = first.setdefault((variant_id, seed), run_id)
        if original == run_id:
            continue
        bind.execute(sa.text("UPDATE runs SET duplicate_of = :o WHERE id = :r"),
                     {"o": original, "r": run_id})
        bind.execute(
            sa.text("INSERT INTO events (campaign_id, run_id, kind, detail) "
                    "VALUES (:c, NULL, 'duplicate_original', :d)"),
            {"c": campaign_id, "d": f"run {run_id} is a second original of seed {seed} beside "
                                    f"run {original}: marked by revision 0006, not counted"},
        )


def _sqlite_trigger_names() -> list[str]:
    names = [f"{t}_no_replace" for t in UNIQUE_KEYS]
    return [*names, "metrics_guard", "runs_inserted_planned", "runs_one_original",
            "runs_duplicate_of_once", "segments_of_running_run"]


def _sqlite_raise_value(message: str) -> str:
    return "RAISE(ABORT, '" + f"{REFUSED}: {message}".replace("'", "''") + "')"


def _metrics_guard() -> str:
    """0005's ``metrics_open`` and the REPLACE guard as one trigger: a metric for an ended
    segment is refused; one whose key is stored is ignored when it repeats the stored value
    (the writer's retried flush) and refused otherwise."""
    key = _match("metrics", METRIC_KEY)
    same = " AND ".join(f"metrics.{c} IS NEW.{c}" for c in METRIC_VALUES)
    ended = _sqlite_raise_value("no metrics row is added to a segment that has ended (or its run)")
    written = _sqlite_raise_value("a metrics row is written once: its key exists (no REPLACE)")
    return (
        "CREATE TRIGGER metrics_guard BEFORE INSERT ON metrics FOR EACH ROW BEGIN SELECT CASE "
        f"WHEN (SELECT ended_at FROM segments WHERE id = NEW.segment_id) IS NOT NULL THEN {ended} "
        f"WHEN EXISTS (SELECT 1 FROM metrics WHERE {key}) THEN (SELECT CASE WHEN EXISTS "
        f"(SELECT 1 FROM metrics WHERE {key} AND {same}) THEN RAISE(IGNORE) ELSE {written} END) "
        "END; END"
    )


# 0005's trigger, put back by the downgrade (a frozen copy).
METRICS_OPEN_0005 = (
    "CREATE TRIGGER metrics_open BEFORE INSERT ON metrics FOR EACH ROW "
    "WHEN (SELECT ended_at FROM segments WHERE id = NEW.segment_id) IS NOT NULL BEGIN "
    "SELECT RAISE(ABORT, 'campaign ledger refused: no metrics row is added to a segment that "
    "has ended (or its run)'); END"
)


def _sqlite_triggers() -> None:
    for table, keys in UNIQUE_KEYS.items():
        exists = " OR ".join(f"EXISTS (SELECT 1 FROM {table} WHERE {_match(table, k)})"
                             for k in keys)
        if table in PARTIAL_KEYS:  # a partial unique index: REPLACE resolves its conflicts too
            exists += f" OR ({PARTIAL_KEYS[table]})"
        op.execute(
            f"CREATE TRIGGER {table}_no_replace BEFORE INSERT ON {table} FOR EACH ROW "
            f"WHEN {exists} BEGIN "
            + _sqlite_raise(f"a {table} row is written once: its key exists (no REPLACE)")
            + " END"
        )
    # The high-volume table: one trigger, not two, does both checks (0005's open segment and
    # this key's), since a trigger program's start costs about as much as its lookups
    # (benchmarks/replace_guard.py).
    op.execute("DROP TRIGGER metrics_open")
    op.execute(_metrics_guard())
    filled = " OR ".join(f"NEW.{c} IS NOT NULL" for c in NOT_AT_INSERT)
    op.execute(
        "CREATE TRIGGER runs_inserted_planned BEFORE INSERT ON runs FOR EACH ROW "
        f"WHEN NEW.status IS NOT 'planned' OR {filled} BEGIN "
        + _sqlite_raise("a run is inserted planned, not started and unmarked") + " END"
    )
    op.execute(
        "CREATE TRIGGER runs_one_original BEFORE INSERT ON runs FOR EACH ROW "
        "WHEN NEW.relaunch_of IS NULL AND EXISTS (SELECT 1 FROM runs WHERE "
        "runs.variant_id = NEW.variant_id AND runs.seed = NEW.seed AND "
        "runs.relaunch_of IS NULL AND runs.duplicate_of IS NULL) BEGIN "
        + _sqlite_raise("one original run per (variant, seed): a repeat is a relaunch") + " END"
    )
    op.execute(
        "CREATE TRIGGER runs_duplicate_of_once BEFORE UPDATE OF duplicate_of ON runs "
        "FOR EACH ROW WHEN NEW.duplicate_of IS NOT OLD.duplicate_of BEGIN "
        + _sqlite_raise("runs.duplicate_of is written by revision 0006 only") + " END"
    )
    op.execute(
        "CREATE TRIGGER segments_of_running_run BEFORE INSERT ON segments FOR EACH ROW "
        "WHEN (SELECT status FROM runs WHERE id = NEW.run_id) IS NOT 'running' BEGIN "
        + _sqlite_raise("a segment is added to a running run only") + " END"
    )


def _postgresql_trigger_names() -> list[tuple[str, str]]:
    return [("runs", "runs_inserted_planned"), ("runs", "runs_one_original"),
            ("runs", "runs_duplicate_of_once"),
            ("segments", "segments_of_running_run")]


def _postgresql_triggers() -> None:
    filled = " OR ".join(f"NEW.{c} IS NOT NULL" for c in NOT_AT_INSERT)
    op.execute(
        f"""
        CREATE FUNCTION campaign_run_inserted_planned() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.status IS DISTINCT FROM 'planned' OR {filled} THEN
                RAISE EXCEPTION '{REFUSED}: run % is inserted planned, not started and '
                    'unmarked (status %)', NEW.id, NEW.status USING ERRCODE = 'restrict_violation';
            END IF;
            RETURN NEW;
        END $$
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION campaign_duplicate_of_once() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.duplicate_of IS DISTINCT FROM OLD.duplicate_of THEN
                RAISE EXCEPTION '{REFUSED}: runs.duplicate_of is written by revision 0006 only '
                    '(run %)', OLD.id USING ERRCODE = 'restrict_violation';
            END IF;
            RETURN NEW;
        END $$
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION campaign_segment_of_running_run() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM runs WHERE id = NEW.run_id AND status = 'running') THEN
                RAISE EXCEPTION '{REFUSED}: a segment is added to a running run only (run %)',
                    NEW.run_id USING ERRCODE = 'restrict_violation';
            END IF;
            RETURN NEW;
        END $$
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION campaign_one_original() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            -- The message; the partial unique index is what holds under concurrent inserts.
            IF NEW.relaunch_of IS NULL AND EXISTS (SELECT 1 FROM runs WHERE
                    variant_id = NEW.variant_id AND seed = NEW.seed
                    AND relaunch_of IS NULL AND duplicate_of IS NULL) THEN
                RAISE EXCEPTION '{REFUSED}: one original run per (variant, seed): a repeat is '
                    'a relaunch (seed %)', NEW.seed USING ERRCODE = 'restrict_violation';
            END IF;
            RETURN NEW;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER runs_inserted_planned BEFORE INSERT ON runs FOR EACH ROW "
        "EXECUTE FUNCTION campaign_run_inserted_planned()"
    )
    op.execute(
        "CREATE TRIGGER runs_one_original BEFORE INSERT ON runs FOR EACH ROW "
        "EXECUTE FUNCTION campaign_one_original()"
    )
    op.execute(
        "CREATE TRIGGER runs_duplicate_of_once BEFORE UPDATE OF duplicate_of ON runs "
        "FOR EACH ROW EXECUTE FUNCTION campaign_duplicate_of_once()"
    )
    op.execute(
        "CREATE TRIGGER segments_of_running_run BEFORE INSERT ON segments FOR EACH ROW "
        "EXECUTE FUNCTION campaign_segment_of_running_run()"
    )
