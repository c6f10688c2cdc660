"""Migrations on both engines: round trip, drift check, old ledgers, newer and older code."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from campaign.ledger import Ledger, LedgerError, StopRecord, migrate
from campaign.ledger.connections import create_ledger_engine, parse_url
from campaign.ledger.migrate import head_revision
from campaign.ledger.models import Base
from tests.support.helpers import plan_campaign
from tests.support.newer_code import build, run_cli
from tests.support.raw import execute

DATA = Path(__file__).parents[1] / "support" / "data"
TABLES = ("campaigns", "variants", "runs", "segments", "metrics", "events",
          "phase_measurements", "artifacts", "pilots", "notes")


def _engine(url: str):
    return create_ledger_engine(parse_url(url))


def _seed(ledger: Ledger) -> None:
    """A little of everything: a finished run with metrics, a note, an event."""
    record = plan_campaign(ledger, seeds=1)
    claim = ledger.claim_next(record.name, "seed-worker")
    with ledger.metric_writer(claim.run_id, claim.segment_id) as writer:
        for step in range(50):
            writer.log("train/loss", step, 2.0 / (step + 1), examples_seen=16 * step)
    ledger.finish(claim.run_id, "completed", StopRecord("budget_reached", 50, "update"))
    ledger.add_note(record.name, "seeded before the upgrade")


def _snapshot(url: str) -> dict[str, list[str]]:
    """Every row of every table, in the columns that revision 0001 knows (later revisions
    only add columns: ``lease_token`` of 0002, ``training_s`` of 0003, ``duplicate_of`` of
    0006, ``author`` of the simulated 9001)."""
    engine = _engine(url)
    try:
        columns = {t: [c["name"] for c in inspect(engine).get_columns(t)] for t in TABLES}
    finally:
        engine.dispose()
    later = ("author", "lease_token", "training_s", "duplicate_of")
    known = {t: [c for c in cols if c not in later] for t, cols in columns.items()}
    return {
        t: sorted(map(repr, execute(url, f"SELECT {', '.join(known[t])} FROM {t}"))) for t in TABLES
    }


def test_upgrade_downgrade_upgrade_round_trip(ledger_url: str) -> None:
    engine = _engine(ledger_url)
    try:
        migrate.upgrade(engine)
        assert migrate.current_revision(engine) == migrate.head_revision()
        migrate.downgrade(engine, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        migrate.upgrade(engine)
        assert set(TABLES) <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    with Ledger.open(ledger_url, create=True) as ledger:
        _seed(ledger)  # the schema works after the round trip, triggers included
        assert len(ledger.metrics("digits-lr")) == 50


def test_head_revision_read_from_the_files_is_alembics_head() -> None:
    """Commands read the head from the revision files (no Alembic import): same answer."""
    assert migrate.head_revision() == migrate._script().get_current_head()


def test_models_match_migrations(ledger_url: str) -> None:
    """``alembic check`` in a test: the models and the revisions must not drift apart."""
    engine = _engine(ledger_url)
    try:
        migrate.upgrade(engine)
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_checked_in_ledger_of_revision_0001_upgrades_and_works(tmp_path: Path) -> None:
    """Ledgers written by earlier releases are kept in tests/support/data and must keep working."""
    path = tmp_path / "old.db"
    shutil.copy(DATA / "ledger-0001.db", path)
    url = f"sqlite:///{path}"
    before = _snapshot(url)
    engine = _engine(url)
    try:
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    assert _snapshot(url) == before
    with Ledger.open(url, create=True) as ledger:
        runs = ledger.runs("digits-lr")
        assert sorted(runs["status"]) == ["completed", "planned", "planned"]
        assert len(ledger.metrics("digits-lr", keys=["train/loss"])) == 50
        claim = ledger.claim_next("digits-lr", "after-upgrade")
        assert claim is not None
        # 0003 loosened the status check in place: the old ledger takes the new status.
        left = ledger.runs("digits-lr", status=["planned"])["run_id"].iloc[0]
        ledger.withdraw(left, "planned by mistake")
        assert ledger.run(left).status == "withdrawn"
        with pytest.raises(LedgerError, match="final"):
            ledger.start(left, "after-upgrade")


@pytest.mark.slow
def test_older_ledger_refused_by_newer_code_until_upgrade(ledger_url: str, tmp_path: Path) -> None:
    """Seed at head, open with the next release: refused (exit 3) -> db upgrade -> data intact."""
    with Ledger.open(ledger_url, create=True) as ledger:
        _seed(ledger)
    before = _snapshot(ledger_url)
    newer = build(tmp_path / "newer")

    refused = run_cli(newer, ledger_url, "campaigns")
    assert refused.returncode == 3, refused.stderr
    assert refused.stderr.strip().count("\n") == 0 and "Traceback" not in refused.stderr
    assert "campaign db upgrade" in refused.stderr and head_revision() in refused.stderr
    assert _snapshot(ledger_url) == before  # nothing written by the refusal

    upgraded = run_cli(newer, ledger_url, "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    assert f"upgraded from {head_revision()} to 9001" in upgraded.stderr
    assert _snapshot(ledger_url) == before  # every row survived the upgrade
    listed = run_cli(newer, ledger_url, "campaigns", "--format", "csv")
    assert listed.returncode == 0 and "digits-lr" in listed.stdout

    # This release meets a ledger from the next one: refused, nothing written.
    older = run_cli(None, ledger_url, "campaigns")
    assert older.returncode == 3
    assert "9001" in older.stderr and "newer code" in older.stderr
    assert "Traceback" not in older.stderr
    assert "DELETE" not in older.stderr
    assert _snapshot(ledger_url) == before


def test_revision_assignments_are_read_in_every_form_alembic_writes() -> None:
    source = (
        'revision: str = "0003"\n'
        "down_revision = '0002'\n"
        "branch_labels = None\n"
        "other_down: tuple = ('a', 'b')\n"
        "computed = make()\n"
    )
    assert migrate._assignments(source) == [
        ("revision", "0003"), ("down_revision", "0002"), ("branch_labels", None),
        ("other_down", ("a", "b")),
    ]
