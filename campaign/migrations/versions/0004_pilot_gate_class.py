"""Pilots per gate class: ``pilots.gate_class`` (frozen like the pilot's other identity).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

A campaign's runs fall into gate classes (campaign/gate_classes.py): a wider
model or another ``max_length`` is another job for the machine and needs its
own pilot. Each pilot records the memory class it speaks for. Pilots written
before this revision have none and keep speaking for the whole frozen spec,
as they did. Plain ``ADD COLUMN``; the frozen-columns trigger of ``pilots``
is recreated with the new column in its list.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REFUSED = "campaign ledger refused"
OLD = ("id", "campaign_id", "config_sha256", "created_at")
NEW = (*OLD, "gate_class")


def upgrade() -> None:
    op.add_column("pilots", sa.Column("gate_class", sa.String(64), nullable=True))
    _frozen(NEW)


def downgrade() -> None:
    _frozen(OLD)
    op.drop_column("pilots", "gate_class")


def _frozen(columns: Sequence[str]) -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("DROP TRIGGER pilots_frozen_columns")
        changed = " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in columns)
        message = f"{REFUSED}: frozen columns of pilots cannot change ({', '.join(columns)})"
        op.execute(
            "CREATE TRIGGER pilots_frozen_columns BEFORE UPDATE ON pilots "
            f"FOR EACH ROW WHEN {changed} BEGIN "
            "SELECT RAISE(ABORT, '" + message.replace("'", "''") + "'); END"
        )
    else:
        op.execute("DROP TRIGGER pilots_frozen_columns ON pilots")
        arguments = ", ".join(f"'{c}'" for c in columns)
        op.execute(
            "CREATE TRIGGER pilots_frozen_columns BEFORE UPDATE ON pilots FOR EACH ROW "
            f"EXECUTE FUNCTION campaign_frozen_columns({arguments})"
        )
