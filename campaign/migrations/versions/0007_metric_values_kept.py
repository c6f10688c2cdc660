"""A stored metric keeps its value against ``INSERT ... ON CONFLICT DO NOTHING`` on PostgreSQL.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

After 0006, SQLite refuses a metric row whose key is stored with another value
whatever the statement's conflict clause (its ``metrics_guard`` trigger), and
ignores one that repeats the stored value (the writer's retried flush). On
PostgreSQL, ``ON CONFLICT DO NOTHING`` with another value was dropped without a
word: the statement "succeeded", the caller believed the new value stored. Row
``BEFORE INSERT`` triggers fire before PostgreSQL's conflict check, so 0005's
``campaign_segment_open()`` (the one trigger function every metric row already
passes) now also refuses a row whose key is stored with other values; a row
with the stored values goes on to the conflict clause (a retried flush is still
a no-op). One index probe per row, on the primary key the insert probes anyway.
SQLite: nothing to change.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REFUSED = "campaign ledger refused"  # a frozen copy (campaign.ledger.connections.REFUSAL_PREFIX)
_OPEN = f"""
            IF EXISTS (SELECT 1 FROM segments WHERE id = NEW.segment_id
                       AND ended_at IS NOT NULL) THEN
                RAISE EXCEPTION '{REFUSED}: no metrics row is added to segment %, which has '
                    'ended (or its run)', NEW.segment_id USING ERRCODE = 'restrict_violation';
            END IF;"""
_KEPT = f"""
            IF EXISTS (SELECT 1 FROM metrics WHERE run_id = NEW.run_id AND key = NEW.key
                       AND step = NEW.step AND segment_id = NEW.segment_id
                       AND (value IS DISTINCT FROM NEW.value
                            OR examples_seen IS DISTINCT FROM NEW.examples_seen)) THEN
                RAISE EXCEPTION '{REFUSED}: a metrics row is written once: its key exists '
                    'with another value (run %, %, step %)', NEW.run_id, NEW.key, NEW.step
                    USING ERRCODE = 'restrict_violation';
            END IF;"""


def _function(body: str) -> str:
    return (f"CREATE OR REPLACE FUNCTION campaign_segment_open() RETURNS trigger "
            f"LANGUAGE plpgsql AS $$\n        BEGIN{body}\n            RETURN NEW;\n"
            "        END $$")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_function(_OPEN + _KEPT))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_function(_OPEN))  # 0005's body
