"""Revision 0006 on both engines, through raw SQL: written-once rows hold against every
statement (REPLACE, forged inserts, a segment or a second original run added afterwards).

Each statement here was accepted before 0006; now the database refuses it with a message
that names the rule, and the rows stay as they were.
"""

from __future__ import annotations

import pytest

from campaign.ledger import Ledger, StopRecord, migrate
from campaign.ledger.connections import create_ledger_engine, parse_url
from campaign.report.balance import balance_sheet
from tests.support.helpers import plan_campaign
from tests.support.raw import execute, refused

RUN_COLUMNS = "id, campaign_id, variant_id, seed, config, config_sha256"


@pytest.fixture
def ended(ledger: Ledger, ledger_url: str) -> dict:
    """A failed run with a metric and a note, a running run, a planned one, a pilot."""
    return _ended(ledger, ledger_url)


@pytest.fixture
def ended_on_sqlite(sqlite_ledger: Ledger, sqlite_url: str) -> dict:
    """:func:`ended` on SQLite alone: REPLACE is SQLite's (PostgreSQL's upserts fire the
    update triggers that test_immutability holds on both engines)."""
    return _ended(sqlite_ledger, sqlite_url)


def _ended(ledger: Ledger, ledger_url: str) -> dict:
    record = plan_campaign(ledger, seeds=1)
    failed = ledger.claim_next(record.name, "w1")
    with ledger.metric_writer(failed.run_id, failed.segment_id) as writer:
        writer.log("val/accuracy", 4, 0.5)
    ledger.finish(failed.run_id, "failed", StopRecord("exception", 4, "forward", "boom"))
    running = ledger.claim_next(record.name, "w2")
    ledger.add_note(record.name, "the original note")
    pilot = ledger.create_pilot(record.name, "f" * 64)
    ledger.set_pilot_verdict(pilot, "failed")
    planned = execute(ledger_url, "SELECT id FROM runs WHERE status = 'planned'")[0][0]
    return {"url": ledger_url, "failed": failed, "running": running, "planned": planned,
            "pilot": pilot}


def _everything(url: str) -> dict:
    tables = ("campaigns", "variants", "runs", "segments", "metrics", "events", "pilots",
              "notes", "artifacts", "phase_measurements")
    return {t: sorted(map(repr, execute(url, f"SELECT * FROM {t}"))) for t in tables}


def _refused(url: str, sql: str, params: tuple = ()) -> str:
    return refused(url, sql, params, unchanged=_everything)


def test_replace_cannot_turn_a_failed_run_into_a_completed_one(ended_on_sqlite: dict) -> None:
    url, run_id = ended_on_sqlite["url"], ended_on_sqlite["failed"].run_id
    row = execute(url, f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))[0]
    for verb in ("INSERT OR REPLACE", "REPLACE"):
        message = _refused(
            url,
            f"{verb} INTO runs ({RUN_COLUMNS}, status, stop_cause, stop_step) "
            "VALUES (?, ?, ?, ?, ?, ?, 'completed', 'budget_reached', 200)",
            row,
        )
        # both rules that speak name the run's key: the row exists, the seed has its original
        assert "runs row is written once" in message or "one original run" in message
    assert execute(url, "SELECT status FROM runs WHERE id = ?", (run_id,)) == [("failed",)]


@pytest.mark.parametrize(
    ("table", "sql"),
    [
        ("notes", "INSERT OR REPLACE INTO notes (id, campaign_id, text) "
                  "SELECT id, campaign_id, 'rewritten' FROM notes"),
        ("campaigns", "INSERT OR REPLACE INTO campaigns (id, name, question, spec, spec_sha256, "
                      "task) SELECT id, name, 'another question', spec, spec_sha256, task "
                      "FROM campaigns"),
        ("campaigns", "INSERT OR REPLACE INTO campaigns (name, question, spec, spec_sha256, "
                      "task) SELECT name, 'by name', spec, spec_sha256, task FROM campaigns"),
        ("variants", "INSERT OR REPLACE INTO variants (id, campaign_id, name, is_control, "
                     "overrides) SELECT id, campaign_id, name, is_control, '{}' FROM variants"),
        ("variants", "INSERT OR REPLACE INTO variants (campaign_id, name, is_control, "
                     "overrides) SELECT campaign_id, 'evil', is_control, '{}' FROM variants "
                     "WHERE is_control"),  # a second control: the partial unique index
        ("events", "INSERT OR REPLACE INTO events (id, campaign_id, run_id, kind, detail) "
                   "SELECT id, campaign_id, run_id, kind, 'forged' FROM events"),
        ("pilots", "INSERT OR REPLACE INTO pilots (id, campaign_id, config_sha256, verdict) "
                   "SELECT id, campaign_id, config_sha256, 'passed' FROM pilots"),
        ("metrics", "INSERT OR REPLACE INTO metrics (run_id, key, step, segment_id, value, "
                    "wall_time) SELECT run_id, key, step, segment_id, 1.0, 0 FROM metrics"),
        ("segments", "INSERT OR REPLACE INTO segments (id, run_id, ordinal, start_step) "
                     "SELECT id, run_id, ordinal, 0 FROM segments"),
    ],
)
def test_replace_rewrites_no_written_row(ended_on_sqlite: dict, table: str, sql: str) -> None:
    message = _refused(ended_on_sqlite["url"], sql)
    assert f"a {table} row is written once" in message or (
        table == "segments" and "added to a running run only" in message) or (
        table == "metrics" and "a segment that has ended" in message)  # the failed run's


def test_a_retried_metric_flush_is_still_idempotent(ended: dict, ledger: Ledger) -> None:
    """The writer's ``ON CONFLICT DO NOTHING`` retry of the same point passes; another value
    for a stored point is refused (it would have been dropped without a word)."""
    url, running = ended["url"], ended["running"]
    with ledger.metric_writer(running.run_id, running.segment_id) as writer:
        writer.log("train/loss", 1, 2.0)
    with ledger.metric_writer(running.run_id, running.segment_id) as writer:
        writer.log("train/loss", 1, 2.0)
    insert = ("INSERT INTO metrics (run_id, key, step, segment_id, value, wall_time) "
              "VALUES (?, 'train/loss', 1, ?, ?, 0) ON CONFLICT DO NOTHING")
    execute(url, insert, (running.run_id, running.segment_id, 2.0))
    message = _refused(url, insert, (running.run_id, running.segment_id, 0.001))  # both engines
    assert "a metrics row is written once: its key exists" in message
    values = execute(url, "SELECT value FROM metrics WHERE run_id = ? AND key = 'train/loss'",
                     (running.run_id,))
    assert values == [(2.0,)]


def test_no_segment_is_added_to_a_run_that_is_not_running(ended: dict, ledger: Ledger) -> None:
    url = ended["url"]
    failed, planned = ended["failed"].run_id, ended["planned"]
    for run_id in (failed, planned):
        message = _refused(url, "INSERT INTO segments (run_id, ordinal, start_step) "
                                "VALUES (?, 9, 0)", (run_id,))
        assert "a segment is added to a running run only" in message
    reads = ledger.metrics("digits-lr", runs=[failed])
    assert list(reads["value"]) == [0.5]
    running = ended["running"].run_id  # the API's own path: a running run's next segment
    execute(url, "INSERT INTO segments (run_id, ordinal, start_step) VALUES (?, 9, 0)",
            (running,))


@pytest.mark.parametrize(
    "forged",
    ["'completed', 'budget_reached', NULL", "'running', NULL, NULL", "'planned', NULL, 'w9'"],
)
def test_a_run_is_inserted_planned_and_empty(ended: dict, forged: str) -> None:
    url = ended["url"]
    campaign_id, variant_id = execute(url, "SELECT campaign_id, variant_id FROM runs "
                                           "WHERE id = ?", (ended["planned"],))[0]
    message = _refused(
        url,
        f"INSERT INTO runs ({RUN_COLUMNS}, relaunch_of, relaunch_reason, status, stop_cause, "
        f"worker) VALUES ('forged', ?, ?, 77, '{{}}', 'x', ?, 'why', {forged})",
        (campaign_id, variant_id, ended["planned"]),
    )
    assert "inserted planned" in message


def test_a_second_original_per_variant_and_seed_is_refused(ended: dict) -> None:
    url = ended["url"]
    campaign_id, variant_id, seed = execute(
        url, "SELECT campaign_id, variant_id, seed FROM runs WHERE id = ?", (ended["planned"],)
    )[0]
    message = _refused(
        url,
        f"INSERT INTO runs ({RUN_COLUMNS}) VALUES ('second', ?, ?, ?, '{{}}', 'x')",
        (campaign_id, variant_id, seed),
    )
    assert "one original run per (variant, seed)" in message
    # a relaunch of the same seed is the way, and is accepted
    execute(url, f"INSERT INTO runs ({RUN_COLUMNS}, relaunch_of, relaunch_reason) "
                 "VALUES ('relaunch', ?, ?, ?, '{}', 'x', ?, 'again')",
            (campaign_id, variant_id, seed, ended["planned"]))


def test_an_older_ledger_with_two_originals_is_marked_not_deleted(ledger_url: str) -> None:
    """Revision 0005 took a second original through raw SQL; 0006 marks the later one,
    records why, and the report counts the seed once."""
    engine = create_ledger_engine(parse_url(ledger_url))
    try:
        migrate.upgrade(engine, "0005")
    finally:
        engine.dispose()
    execute(ledger_url, "INSERT INTO campaigns (name, question, spec, spec_sha256, task) "
                        "VALUES ('old', 'q', '{}', 'x', 'campaign.tasks.digits:build')")
    execute(ledger_url, "INSERT INTO variants (campaign_id, name, is_control, overrides) "
                        "VALUES (1, 'control', TRUE, '{}')")
    for run_id in ("first", "second"):
        execute(ledger_url, f"INSERT INTO runs ({RUN_COLUMNS}) "
                            f"VALUES ('{run_id}', 1, 1, 0, '{{}}', 'x')")
    before = execute(ledger_url, "SELECT id, status FROM runs ORDER BY id")
    engine = create_ledger_engine(parse_url(ledger_url))
    try:
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    assert execute(ledger_url, "SELECT id, status FROM runs ORDER BY id") == before
    assert execute(ledger_url, "SELECT id, duplicate_of FROM runs ORDER BY id") == [
        ("first", None), ("second", "first")]
    events = execute(ledger_url, "SELECT kind, detail FROM events WHERE run_id IS NULL")
    assert events[0][0] == "duplicate_original" and "run second" in events[0][1]
    message = _refused(ledger_url, "UPDATE runs SET duplicate_of = NULL WHERE id = 'second'")
    assert "duplicate_of" in message
    with Ledger.open(ledger_url) as opened:
        sheet = balance_sheet(opened, "old")
    assert sheet.variants["planned"].tolist() == [1]
    lines = sheet.runs.set_index("run_id")["original"]
    assert lines.to_dict() == {"first": True, "second": False}
