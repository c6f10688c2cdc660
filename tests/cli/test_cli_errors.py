"""Bad ledger input: one clear line on stderr, exit code 3, nothing written (docs/cli.md)."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from campaign.cli import main
from campaign.ledger import Ledger
from tests.support.helpers import plan_campaign
from tests.support.raw import execute


def _invoke(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--ledger", url, *args])


def _assert_one_line_exit_3(result: Result, *expected: str) -> None:
    assert result.exit_code == 3, (result.output, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    for text in expected:
        assert text in lines[0]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("nonsense", "malformed ledger URL 'nonsense'"),
        ("mysql://root@127.0.0.1/test", "unsupported ledger URL"),
        ("sqlite:////no/such/directory/ledger.db", "does not exist"),
        ("postgresql://postgres@127.0.0.1:1/test", "unreachable"),
    ],
)
@pytest.mark.parametrize("command", [("campaigns",), ("db", "upgrade"), ("db", "current")])
def test_bad_urls(url: str, expected: str, command: tuple[str, ...]) -> None:
    if command == ("campaigns",) and url.startswith("sqlite"):
        expected = "no ledger at /no/such/directory/ledger.db"  # a reading command creates nothing
    _assert_one_line_exit_3(_invoke(url, *command), expected)


@pytest.mark.parametrize("url", [
    "postgresql://me:s3cret@127.0.0.1:1/test",
    "postgresql://me@127.0.0.1:1/test?password=s3cret",  # libpq reads it from the query too
    "postgresql:///test?host=127.0.0.1&port=1&password=s3cret&sslpassword=s3cret",
])
def test_password_never_printed(url: str) -> None:
    for command in (("campaigns",), ("db", "current"), ("runs", "x")):
        result = _invoke(url, *command)
        _assert_one_line_exit_3(result, "unreachable")
        assert "s3cret" not in result.stderr and "s3cret" not in result.stdout


@pytest.mark.parametrize("command", [("campaigns",), ("db", "upgrade")])
def test_sqlite_file_that_is_not_a_ledger(tmp_path: Path, command: tuple[str, ...]) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE patients (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO patients (name) VALUES ('A')")
    before = _digest(path)
    _assert_one_line_exit_3(_invoke(f"sqlite:///{path}", *command), "not a campaign ledger",
                            "patients")
    assert _digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def test_file_that_is_not_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 100)
    before = _digest(path)
    _assert_one_line_exit_3(_invoke(f"sqlite:///{path}", "campaigns"), "not a SQLite database")
    assert _digest(path) == before


def test_postgresql_database_that_is_not_a_ledger(postgresql_url: str) -> None:
    execute(postgresql_url, "CREATE TABLE invoices (id integer PRIMARY KEY)")
    _assert_one_line_exit_3(_invoke(postgresql_url, "campaigns"), "not a campaign ledger",
                            "invoices")
    assert execute(postgresql_url, "SELECT COUNT(*) FROM information_schema.tables "
                   "WHERE table_schema = 'public'") == [(1,)]


def test_ledger_at_unknown_revision(ledger_url: str) -> None:
    with Ledger.open(ledger_url, create=True) as ledger:
        plan_campaign(ledger, seeds=1)
    execute(ledger_url, "UPDATE alembic_version SET version_num = '0999'")
    counts = [execute(ledger_url, f"SELECT COUNT(*) FROM {t}") for t in ("runs", "events")]
    for command in (("campaigns",), ("db", "upgrade")):
        result = _invoke(ledger_url, *command)
        _assert_one_line_exit_3(result, "0999", "unknown to this campaign version")
    assert [execute(ledger_url, f"SELECT COUNT(*) FROM {t}") for t in ("runs", "events")] == counts
    assert execute(ledger_url, "SELECT version_num FROM alembic_version") == [("0999",)]


def test_db_current_reports_without_creating(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    result = _invoke(f"sqlite:///{path}", "db", "current", "--format", "json")
    assert result.exit_code == 0
    assert '"state": "empty"' in result.stdout
    assert not path.exists()


def test_db_current_names_each_state(tmp_path: Path, ledger_url: str) -> None:
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE t (x)")
    result = _invoke(f"sqlite:///{foreign}", "db", "current", "--format", "json")
    assert '"state": "not a campaign ledger"' in result.stdout
    Ledger.open(ledger_url, create=True).close()
    current = _invoke(ledger_url, "db", "current", "--format", "json")
    assert '"state": "up to date"' in current.stdout
    execute(ledger_url, "UPDATE alembic_version SET version_num = '0999'")
    unknown = _invoke(ledger_url, "db", "current", "--format", "json")
    assert unknown.exit_code == 0 and "written by newer code" in unknown.stdout
