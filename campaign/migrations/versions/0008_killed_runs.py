"""Faults outside a run: the stop causes ``killed`` and ``ledger_unreachable``.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05

The kernel's OOM killer, an operator's ``kill -9``: the run's process dies without a word.
Its supervisor ends it ``interrupted`` with the cause ``killed`` (resumable like a preempted
run, docs/runs.md), and only a second kill at the same update makes it ``failed`` with that
cause. A run whose ledger stayed unreachable (an outage past ``CAMPAIGN_LEDGER_OUTAGE_S``, a
SQLite file locked past the run's patience) ends ``interrupted``/``ledger_unreachable``.
The causes join the CHECK on ``runs.stop_cause``; on SQLite by the documented
``writable_schema`` rewrite of 0003 and 0005 (loosening a CHECK: every row satisfies the
wider one). Frozen lists here, never the live vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REFUSED = "campaign ledger refused"
OLD_CAUSES = (
    "budget_reached", "non_finite_loss", "non_finite_grad", "loss_explosion", "early_stop",
    "wall_time", "out_of_memory", "exception", "interrupted", "preempted", "heartbeat_lost",
    "stalled",
)
NEW_CAUSES = (*OLD_CAUSES, "killed", "ledger_unreachable")


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    _set_causes(NEW_CAUSES, OLD_CAUSES)


def downgrade() -> None:
    held = op.get_bind().execute(sa.text(
        "SELECT count(*) FROM runs WHERE stop_cause IN ('killed', 'ledger_unreachable')"))
    if held.scalar_one():
        raise RuntimeError(f"{REFUSED}: the ledger holds runs killed or ended by an unreachable "
                           "ledger; revision 0007 has no such causes")
    _set_causes(OLD_CAUSES, NEW_CAUSES)


def _set_causes(causes: Sequence[str], before: Sequence[str]) -> None:
    bind = op.get_bind()
    check = f"stop_cause IS NULL OR {_in('stop_cause', causes)}"
    if bind.dialect.name == "postgresql":
        op.drop_constraint("ck_runs_stop_cause", "runs", type_="check")
        op.create_check_constraint("ck_runs_stop_cause", "runs", check)
        return
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
