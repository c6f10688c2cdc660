"""The gaps of issue 14 point 4, closed by revision 0005 on both engines, through raw SQL.

Each statement here was accepted before 0005 on a completed run; now the
database refuses it and the rows stay as they were.
"""

from __future__ import annotations

import pytest

from campaign.ledger import Ledger, StopRecord
from tests.support.helpers import plan_campaign
from tests.support.raw import REFUSAL_ERRORS, execute, refused


@pytest.fixture
def ended(ledger: Ledger, ledger_url: str) -> dict:
    """A completed run with its environment, a metric, an ended segment; a failed pilot;
    a running run with an open segment."""
    record = plan_campaign(ledger, seeds=2)
    done = ledger.claim_next(record.name, "w1")
    ledger.set_environment(done.run_id, {"torch": "2.13.0", "host": "a"})
    with ledger.metric_writer(done.run_id, done.segment_id) as writer:
        writer.log("val/accuracy", 4, 0.5)
    ledger.finish(done.run_id, "completed", StopRecord("budget_reached", 4, "update"))
    running = ledger.claim_next(record.name, "w2")
    pilot = ledger.create_pilot(record.name, "f" * 64)
    ledger.set_pilot_verdict(pilot, "failed")
    campaign_id = execute(ledger_url, "SELECT id FROM campaigns")[0][0]
    return {"url": ledger_url, "done": done, "running": running, "pilot": pilot,
            "campaign_id": campaign_id}


def _counts(url: str) -> tuple:
    tables = ("metrics", "artifacts", "events", "phase_measurements", "segments", "pilots")
    return tuple(execute(url, f"SELECT COUNT(*) FROM {t}")[0][0] for t in tables)


def _refused(url: str, sql: str, params: tuple = ()) -> str:
    return refused(url, sql, params, unchanged=_counts)


def test_environment_is_written_once(ended: dict) -> None:
    url, run_id = ended["url"], ended["done"].run_id
    before = execute(url, "SELECT environment FROM runs WHERE id = ?", (run_id,))
    message = _refused(url, "UPDATE runs SET environment = '{\"torch\": \"9\"}' WHERE id = ?",
                       (run_id,))
    assert "environment" in message
    assert execute(url, "SELECT environment FROM runs WHERE id = ?", (run_id,)) == before
    running = ended["running"].run_id  # a first write is allowed, a second is not
    execute(url, "UPDATE runs SET environment = '{}' WHERE id = ?", (running,))
    _refused(url, "UPDATE runs SET environment = '{\"a\": 1}' WHERE id = ?", (running,))


def test_a_segments_end_is_written_once(ended: dict) -> None:
    url, segment = ended["url"], ended["done"].segment_id
    for change in ("end_step = 99999", "ended_at = CURRENT_TIMESTAMP", "training_s = 0",
                   "worker = 'someone'"):
        message = _refused(url, f"UPDATE segments SET {change} WHERE id = ?", (segment,))
        assert "written once" in message
    open_segment = ended["running"].segment_id  # an open segment may still be ended
    execute(url, "UPDATE segments SET end_step = 3 WHERE id = ?", (open_segment,))


def test_a_pilots_verdict_is_written_once(ended: dict) -> None:
    url, pilot = ended["url"], ended["pilot"]
    _refused(url, "UPDATE pilots SET verdict = 'passed' WHERE id = ?", (pilot,))
    assert execute(url, "SELECT verdict FROM pilots WHERE id = ?", (pilot,)) == [("failed",)]


def test_the_launch_gate_stays_closed_after_a_forged_verdict(ended: dict, ledger: Ledger) -> None:
    with pytest.raises(REFUSAL_ERRORS):
        execute(ended["url"], "UPDATE pilots SET verdict = 'passed'")
    assert set(ledger.pilots("digits-lr")["verdict"]) == {"failed"}


@pytest.mark.parametrize(
    ("table", "sql"),
    [
        ("metrics", "INSERT INTO metrics (run_id, segment_id, key, step, value, wall_time) "
                    "VALUES (?, ?, 'val/accuracy', 999, 1.0, 0)"),
        ("artifacts", "INSERT INTO artifacts (run_id, kind, path, sha256, bytes) "
                      "VALUES (?, 'final', '/tmp/forged', 'ab', 1)"),
        ("phase_measurements", "INSERT INTO phase_measurements (run_id, phase, device) "
                               "VALUES (?, 'forward', 'cpu')"),
        ("events", "INSERT INTO events (campaign_id, run_id, kind, detail) "
                   "VALUES (?, ?, 'completed', 'forged')"),
    ],
)
def test_nothing_is_added_to_an_ended_run(ended: dict, table: str, sql: str) -> None:
    url, done = ended["url"], ended["done"]
    params: tuple = {
        "metrics": (done.run_id, done.segment_id),
        "events": (ended["campaign_id"], done.run_id),
    }.get(table, (done.run_id,))
    message = _refused(url, sql, params)
    assert table in message or "has ended" in message
    # the same row for a running run (its open segment) is accepted
    running = ended["running"]
    params = {
        "metrics": (running.run_id, running.segment_id),
        "events": (ended["campaign_id"], running.run_id),
    }.get(table, (running.run_id,))
    execute(url, sql, params)


def test_no_metric_is_added_to_an_ended_segment(ended: dict, ledger: Ledger) -> None:
    """A run resumed in a new segment: its first segment is closed for good."""
    url, running = ended["url"], ended["running"]
    ledger.finish(running.run_id, "interrupted", StopRecord("interrupted", 2, "update"))
    resumed = ledger.start(running.run_id, "w3", start_step=0)
    message = _refused(
        url,
        "INSERT INTO metrics (run_id, segment_id, key, step, value, wall_time) "
        "VALUES (?, ?, 'train/loss', 7, 0.1, 0)",
        (running.run_id, running.segment_id),
    )
    assert "segment" in message
    insert = ("INSERT INTO metrics (run_id, segment_id, key, step, value, wall_time) "
              "VALUES (?, ?, 'train/loss', 7, 0.1, 0)")
    execute(url, insert, (running.run_id, resumed.segment_id))


def test_campaign_level_events_and_notes_stay_open(ended: dict, ledger: Ledger) -> None:
    ledger.add_event("digits-lr", "reviewed", "campaign-level events are not a run's")
    ledger.add_note("digits-lr", "still writable after the runs ended")
    assert "reviewed" in set(ledger.events("digits-lr")["kind"])
    assert "still writable after the runs ended" in set(ledger.notes("digits-lr")["text"])


def test_a_resumed_segment_on_another_stack_keeps_the_first(ended: dict, ledger: Ledger) -> None:
    url, running = ended["url"], ended["running"]
    ledger.set_environment(running.run_id, {"torch": "2.13.0", "host": "a"})
    ledger.set_environment(running.run_id, {"torch": "2.13.0", "host": "b"})
    stored = execute(url, "SELECT environment FROM runs WHERE id = ?", (running.run_id,))[0][0]
    assert '"host":"a"' in stored.replace(" ", "")
    events = ledger.events("digits-lr", run_id=running.run_id)
    differs = events[events["kind"] == "environment_differs"]
    assert len(differs) == 1 and "host: 'a' -> 'b'" in differs["detail"].iloc[0]


def test_a_run_cannot_end_around_its_open_segment(ended: dict) -> None:
    """Metrics are checked by their segment alone (one lookup a row): that is sound because a
    run in a terminal status never has an open segment."""
    url, running = ended["url"], ended["running"]
    sql = ("UPDATE runs SET status = 'completed', stop_cause = 'budget_reached', "
           "ended_at = CURRENT_TIMESTAMP WHERE id = ?")
    message = _refused(url, sql, (running.run_id,))
    assert "end the segment first" in message
    assert execute(url, "SELECT status FROM runs WHERE id = ?", (running.run_id,)) == [("running",)]
