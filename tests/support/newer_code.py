"""Build a copy of the installed package with one extra revision: "the next release".

Used to show, without any test-only branch in the product, that a ledger at
an older revision is refused by newer code until `campaign db upgrade`, that
the upgrade keeps every row, and that older code refuses a ledger written by
newer code.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import campaign
from campaign.ledger.migrate import head_revision

NEXT_REVISION = '''"""Notes get an optional author (a test revision: the next release).

Revision ID: 9001
Revises: {head}
"""

import sqlalchemy as sa
from alembic import op

revision = "9001"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN: SQLite keeps the table, so its triggers survive.
    op.add_column("notes", sa.Column("author", sa.String(100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("notes") as batch:
        batch.drop_column("author")
'''


def build(root: Path) -> Path:
    """Copy ``campaign`` (with its migrations) under ``root`` and add revision 9001."""
    source = Path(campaign.__file__).parent
    target = root / "campaign"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    migrations = target / "migrations"
    revision = NEXT_REVISION.replace("{head}", head_revision())
    (migrations / "versions" / "9001_notes_author.py").write_text(revision)
    return root


def run_cli(code_root: Path | None, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m campaign --ledger URL ARGS`` with ``code_root`` first on the path."""
    env = dict(os.environ)
    if code_root is not None:
        env["PYTHONPATH"] = str(code_root)
    return subprocess.run(
        [sys.executable, "-m", "campaign", "--ledger", url, *args],
        capture_output=True, text=True, env=env, cwd=code_root or Path.cwd(), timeout=120,
    )
