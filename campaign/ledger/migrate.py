"""Schema revisions: the startup check, first-use creation and upgrades.

The migrations ship inside the package (``campaign.migrations``, the folder
``campaign/migrations/`` of the source tree), so they work from a non-editable
install in any directory.

Concurrency: every migration runs inside one write transaction that first
takes a lock (PostgreSQL: a transaction-scoped advisory lock; SQLite: the
database write lock taken by ``BEGIN IMMEDIATE``). A process that waited for
the lock re-reads the revision and finds the work done, so eight processes
opening the same fresh ledger run the migrations exactly once.
"""

from __future__ import annotations

import ast
import contextlib
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.engine import URL

from campaign.errors import LedgerRevisionError, NotALedger
from campaign.ledger.connections import (
    create_ledger_engine,
    enable_wal,
    parse_url,
    safe_url,
    sqlite_path,
    translated,
    write_connection,
)

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

# pg_advisory_xact_lock key: "campaign" in ASCII, fits a bigint.
_ADVISORY_LOCK_KEY = 0x63616D706169676E
UPGRADE_HINT = "run `campaign db upgrade`"


@dataclass(frozen=True)
class SchemaState:
    """What a database holds, as far as the ledger schema is concerned."""

    revision: str | None  # None: no campaign revision recorded
    tables: frozenset[str]

    @property
    def is_empty(self) -> bool:
        return self.revision is None and not self.tables


def alembic_config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(files("campaign.migrations")))
    return config


@lru_cache(maxsize=1)
def _script() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


@lru_cache(maxsize=1)
def head_revision() -> str:
    """The newest revision the package ships: the one no other revision revises.

    Read from the revision files' ``revision`` / ``down_revision`` assignments
    (parsed, not imported) instead of through Alembic, whose import costs every
    command ~0.15 s; a test checks that this answer equals Alembic's own head.
    """
    revisions: set[str] = set()
    revised: set[str] = set()
    for path in (files("campaign.migrations") / "versions").iterdir():
        if not path.name.endswith(".py") or path.name.startswith("__"):
            continue
        for name, value in _assignments(path.read_text()):
            if name == "revision":
                revisions.add(value)
            elif name == "down_revision" and value is not None:
                revised.update([value] if isinstance(value, str) else value)
    heads = revisions - revised
    assert len(heads) == 1, f"the package must ship one head revision, found {sorted(heads)}"
    return heads.pop()


def _assignments(source: str) -> list[tuple[str, Any]]:
    """Module-level ``name = literal`` and ``name: type = literal`` pairs of a revision file."""
    found = []
    for node in ast.parse(source).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and getattr(node, "value", None) is not None:
            with contextlib.suppress(ValueError):
                found.append((target.id, ast.literal_eval(node.value)))  # type: ignore[arg-type]
    return found


def known_scripts() -> list[Any]:
    """The migration scripts this code carries (Alembic's ``Script`` objects)."""
    return list(_script().walk_revisions())


def is_known_revision(revision: str) -> bool:
    return any(script.revision == revision for script in known_scripts())


def read_state(conn: Connection) -> SchemaState:
    tables = frozenset(inspect(conn).get_table_names())
    revision = None
    if "alembic_version" in tables:
        revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    return SchemaState(revision, tables - {"alembic_version"})


def ensure_ready(engine: Engine, *, create: bool = True) -> str:
    """Check the ledger's revision before any write; create a fresh ledger at head.

    Returns the revision. Raises :class:`NotALedger` for a database holding
    other tables, :class:`LedgerRevisionError` for an older or unknown revision.
    """
    where = safe_url(engine.url)
    with translated(engine.url, "reading the ledger revision"), engine.connect() as conn:
        state = read_state(conn)
    if state.is_empty and create:
        return _create_at_head(engine)
    return check_revision(state, where)


def check_revision(state: SchemaState, where: str) -> str:
    head = head_revision()
    if state.revision is None:
        if not state.tables:
            raise LedgerRevisionError(f"ledger {where} has no schema yet: {UPGRADE_HINT}")
        listed = ", ".join(sorted(state.tables)[:5])
        raise NotALedger(
            f"{where} is not a campaign ledger: it holds other tables ({listed}) "
            "and no campaign schema revision"
        )
    if state.revision == head:
        return head
    if is_known_revision(state.revision):
        raise LedgerRevisionError(
            f"ledger {where} is at revision {state.revision}, "
            f"this code needs {head}: {UPGRADE_HINT}"
        )
    raise LedgerRevisionError(
        f"ledger {where} is at revision {state.revision}, unknown to this campaign version "
        f"(head {head}): it was written by newer code; upgrade the campaign package"
    )


def _create_at_head(engine: Engine) -> str:
    # WAL cannot be switched on inside a transaction; it persists in the file.
    with translated(engine.url, "creating the ledger"):
        enable_wal(engine)
    upgrade(engine, "head", only_if_empty=True)
    return head_revision()


def upgrade(engine: Engine, revision: str = "head", *, only_if_empty: bool = False) -> None:
    """Bring the ledger to ``revision`` under the migration lock.

    ``only_if_empty``: the first-use path; if another process created the
    schema while we waited for the lock, do nothing.
    """
    with (
        translated(engine.url, "upgrading the ledger"),
        write_connection(engine) as conn,
        conn.begin(),
    ):
        _take_migration_lock(conn)
        state = read_state(conn)
        if only_if_empty and not state.is_empty:
            return
        if state.revision is None and state.tables:
            check_revision(state, safe_url(engine.url))  # raises NotALedger
        if state.revision is not None and not is_known_revision(state.revision):
            check_revision(state, safe_url(engine.url))  # raises: newer code's ledger
        _run_alembic(conn, "upgrade", revision)
    enable_wal(engine)


def downgrade(engine: Engine, revision: str) -> None:
    """Step the schema back (developers and migration tests; drops data of later revisions)."""
    with (
        translated(engine.url, "downgrading the ledger"),
        write_connection(engine) as conn,
        conn.begin(),
    ):
        _take_migration_lock(conn)
        _run_alembic(conn, "downgrade", revision)


def describe(url: URL) -> dict[str, str | None]:
    """Where a ledger stands: its revision, this code's head, and a word for the state.

    Looks without writing: a SQLite file that does not exist yet is not created.
    """
    head = head_revision()
    path = sqlite_path(url)
    if path is not None and path.parent.exists() and not path.exists():
        state = SchemaState(None, frozenset())
    else:
        engine = create_ledger_engine(url)
        try:
            with translated(url, "reading the ledger revision"), engine.connect() as conn:
                state = read_state(conn)
        finally:
            engine.dispose()
    if state.revision == head:
        word = "up to date"
    elif state.revision is None:
        word = "not a campaign ledger" if state.tables else "empty"
    elif is_known_revision(state.revision):
        word = "outdated: run `campaign db upgrade`"
    else:
        word = "unknown revision (written by newer code)"
    return {"ledger": safe_url(url), "revision": state.revision, "head": head, "state": word}


def current_revision(engine: Engine) -> str | None:
    with translated(engine.url, "reading the ledger revision"), engine.connect() as conn:
        return read_state(conn).revision


def _take_migration_lock(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _ADVISORY_LOCK_KEY})
    # SQLite: BEGIN IMMEDIATE of the write connection already holds the write lock.


def _run_alembic(conn: Connection, verb: str, revision: str) -> None:
    from alembic import command

    config = alembic_config()
    config.attributes["connection"] = conn
    getattr(command, verb)(config, revision)


def describe_url(text: str) -> dict[str, str | None]:
    """:func:`describe` for a ledger URL as written by a user."""
    return describe(parse_url(text))


def upgrade_url(text: str, revision: str = "head") -> tuple[str, str | None, str | None]:
    """Upgrade the ledger at ``text`` (creating a missing SQLite file); (where, before, after)."""
    engine = create_ledger_engine(parse_url(text))
    try:
        before = current_revision(engine)
        upgrade(engine, revision)
        return safe_url(engine.url), before, current_revision(engine)
    finally:
        engine.dispose()
