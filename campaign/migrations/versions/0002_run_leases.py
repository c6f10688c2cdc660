"""Leases: a run's current owner holds a token that every write of its segment carries.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

Every engine runs work at least once (Ray retries a task, SLURM requeues a
job), so a worker that was paused or cut off may wake up after its run was
declared lost and reclaimed. Claiming a run writes a fresh random token on
the run and on the segment it opens; the worker's later writes (heartbeat,
metrics, artifacts, measurements, events, the end) are accepted only while
the run is ``running`` under that same token. Plain ``ADD COLUMN``: SQLite
keeps the tables, so the immutability triggers of 0001 stay in place.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("lease_token", sa.String(64), nullable=True))
    op.add_column("segments", sa.Column("lease_token", sa.String(64), nullable=True))


def downgrade() -> None:
    op.drop_column("segments", "lease_token")
    op.drop_column("runs", "lease_token")
