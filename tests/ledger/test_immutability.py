"""The database itself refuses what the ledger never does (docs/ledger.md), on both engines.

Every statement here goes through a raw driver connection, past the API.
"""

from __future__ import annotations

import pytest
import sqlalchemy

from campaign.ledger import Ledger, StopRecord
from tests.support.helpers import plan_campaign
from tests.support.raw import REFUSAL_ERRORS, execute


@pytest.fixture
def seeded(ledger: Ledger, ledger_url: str) -> dict:
    """Runs in every interesting state, with a metric, an artifact, a measurement, a note."""
    record = plan_campaign(ledger, seeds=2)
    done = ledger.claim_next(record.name, "w1")
    with ledger.metric_writer(done.run_id, done.segment_id) as writer:
        writer.log("train/loss", 1, 2.5)
    artifact = ledger.add_artifact(done.run_id, "final", "/tmp/final.safetensors", "ab" * 32, 10)
    ledger.add_phase_measurements([{"run_id": done.run_id, "phase": "forward", "device": "cpu",
                                    "duration_s": 0.1, "verdict": "pass"}])
    ledger.finish(done.run_id, "completed", StopRecord("budget_reached", 200, "update"))
    running = ledger.claim_next(record.name, "w2")
    interrupted = ledger.claim_next(record.name, "w3")
    ledger.finish(interrupted.run_id, "interrupted", StopRecord("interrupted", 40, "forward"))
    ledger.add_note(record.name, "control kept")
    planned = [r for r in record.run_ids if r not in {done.run_id, running.run_id,
                                                       interrupted.run_id}]
    return {
        "url": ledger_url,
        "completed": done.run_id,
        "running": running.run_id,
        "interrupted": interrupted.run_id,
        "planned": planned[0],
        "other": planned[1],
        "artifact": artifact,
    }


def _refused(url: str, sql: str, params: tuple = ()) -> str:
    with pytest.raises(REFUSAL_ERRORS) as caught:
        execute(url, sql, params)
    return str(caught.value)


@pytest.mark.parametrize(
    "table",
    ["runs", "metrics", "events", "phase_measurements", "artifacts",
     "campaigns", "variants", "segments", "notes"],
)
def test_no_delete(seeded: dict, table: str) -> None:
    url = seeded["url"]
    before = execute(url, f"SELECT COUNT(*) FROM {table}")[0][0]
    assert before > 0
    message = _refused(url, f"DELETE FROM {table}")
    assert "campaign ledger refused" in message and table in message
    assert execute(url, f"SELECT COUNT(*) FROM {table}")[0][0] == before


def test_no_truncate_on_postgresql(seeded: dict) -> None:
    url = seeded["url"]
    if url.startswith("sqlite"):
        pytest.skip("capability: SQLite has no TRUNCATE statement")
    for table in ("metrics", "runs", "events"):
        assert "never truncated" in _refused(url, f"TRUNCATE {table} CASCADE")


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("id", "'01aaaaaaaaaaaaaaaaaaaaaaaa'"),
        ("campaign_id", "campaign_id + 1"),
        ("variant_id", "variant_id + 1"),
        ("seed", "seed + 1"),
        ("config", "'{}'"),
        ("config_sha256", "'0000'"),
        ("relaunch_of", "?"),
    ],
)
def test_run_identity_and_frozen_columns(seeded: dict, column: str, value: str) -> None:
    url = seeded["url"]
    params = (seeded["other"],) if "?" in value else ()
    for state in ("planned", "running", "completed"):
        run_id = seeded[state]
        before = execute(url, "SELECT * FROM runs WHERE id = ?", (run_id,))
        message = _refused(url, f"UPDATE runs SET {column} = {value} WHERE id = ?",
                           (*params, run_id))
        assert "frozen" in message
        assert execute(url, "SELECT * FROM runs WHERE id = ?", (run_id,)) == before


@pytest.mark.parametrize("target", ["running", "failed", "planned", "interrupted"])
def test_terminal_status_is_never_left(seeded: dict, target: str) -> None:
    url = seeded["url"]
    run_id = seeded["completed"]
    for statement in ("UPDATE runs SET status = ?, stop_cause = NULL WHERE id = ?",
                      "UPDATE runs SET status = ? WHERE id = ?"):
        message = _refused(url, statement, (target, run_id))
        rule = ("a terminal status is never left" if url.startswith("postgresql")
                else "run status transition not allowed")  # each engine's trigger names it
        assert message.startswith("campaign ledger refused") and rule in message, message
    assert execute(url, "SELECT status FROM runs WHERE id = ?", (run_id,)) == [("completed",)]


def test_terminal_stop_fields_are_final(seeded: dict) -> None:
    url = seeded["url"]
    run_id = seeded["completed"]
    for assignment in ("stop_cause = 'early_stop'", "stop_step = 7", "stop_phase = 'data'",
                       "stop_detail = 'rewritten'", "ended_at = NULL"):
        assert "final" in _refused(url, f"UPDATE runs SET {assignment} WHERE id = ?", (run_id,))


@pytest.mark.parametrize(
    ("state", "target"),
    [("planned", "completed"), ("planned", "interrupted"), ("interrupted", "completed"),
     ("running", "planned"), ("interrupted", "planned"), ("running", "withdrawn"),
     ("interrupted", "withdrawn"), ("completed", "withdrawn")],
)
def test_illegal_transitions(seeded: dict, state: str, target: str) -> None:
    """Each change satisfies every CHECK constraint (a stop cause exactly when the target is an
    end status), so what refuses it is the transition trigger itself."""
    url = seeded["url"]
    run_id = seeded[state]
    _end_segments(url, run_id)  # so that the status rule alone speaks (0005 wants this first)
    cause = None if target in ("planned", "running", "withdrawn") else "exception"
    message = _refused(
        url, "UPDATE runs SET status = ?, stop_cause = ? WHERE id = ?", (target, cause, run_id)
    )
    assert "campaign ledger refused" in message  # the trigger's words (a CHECK names itself)
    assert any(words in message for words in (
        "transition not allowed", f"cannot go from {state} to {target}", "final"))
    assert execute(url, "SELECT status FROM runs WHERE id = ?", (run_id,)) == [(state,)]


def test_withdrawn_only_from_planned_and_final(seeded: dict) -> None:
    """planned -> withdrawn is the one way in (no stop cause: it never ran); it is never left."""
    url, run_id = seeded["url"], seeded["planned"]
    _refused(url, "UPDATE runs SET status = 'withdrawn', stop_cause = 'exception' WHERE id = ?",
             (run_id,))
    execute(url, "UPDATE runs SET status = 'withdrawn', stop_detail = 'by mistake' WHERE id = ?",
            (run_id,))
    for target in ("running", "planned"):
        message = _refused(url, "UPDATE runs SET status = ? WHERE id = ?", (target, run_id))
        assert "final" in message or "transition not allowed" in message
    assert "final" in _refused(url, "UPDATE runs SET stop_detail = 'x' WHERE id = ?", (run_id,))


def _end_segments(url: str, run_id: str) -> None:
    execute(url, "UPDATE segments SET ended_at = CURRENT_TIMESTAMP WHERE run_id = ? "
                 "AND ended_at IS NULL", (run_id,))


def test_ended_run_needs_a_stop_cause(seeded: dict) -> None:
    url = seeded["url"]
    _end_segments(url, seeded["running"])
    message = _refused(url, "UPDATE runs SET status = 'failed' WHERE id = ?", (seeded["running"],))
    assert "stop_cause_iff_ended" in message


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE metrics SET value = 0",
        "UPDATE events SET detail = 'edited'",
        "UPDATE artifacts SET sha256 = 'forged'",
        "UPDATE phase_measurements SET duration_s = 0",
        "UPDATE campaigns SET spec = '{}'",
        "UPDATE campaigns SET question = 'another question'",
        "UPDATE variants SET is_control = NOT is_control",
        "UPDATE notes SET text = 'rewritten'",
        "UPDATE segments SET ordinal = ordinal + 10",
    ],
)
def test_written_once_rows(seeded: dict, sql: str) -> None:
    assert "campaign ledger refused" in _refused(seeded["url"], sql)


def test_allowed_updates_succeed(seeded: dict) -> None:
    """Status forward, heartbeat, stop fields once, resume: the database lets them through."""
    url = seeded["url"]
    planned, running, interrupted = seeded["planned"], seeded["running"], seeded["interrupted"]
    execute(url, "UPDATE runs SET status = 'running', worker = 'raw' WHERE id = ?", (planned,))
    execute(url, "UPDATE runs SET heartbeat_at = CURRENT_TIMESTAMP WHERE id = ?", (running,))
    execute(url, "UPDATE runs SET environment = '{}' WHERE id = ?", (running,))
    execute(url, "UPDATE segments SET end_step = 12, ended_at = CURRENT_TIMESTAMP WHERE run_id = ?",
            (running,))  # a run ends after its segment (revision 0005)
    execute(
        url,
        "UPDATE runs SET status = 'diverged', stop_cause = 'loss_explosion', stop_step = 12, "
        "stop_phase = 'forward', stop_detail = 'loss 9.1 > 4 x 2.2', ended_at = CURRENT_TIMESTAMP "
        "WHERE id = ?",
        (running,),
    )
    execute(
        url,
        "UPDATE runs SET status = 'running', stop_cause = NULL, stop_step = NULL, "
        "stop_phase = NULL, stop_detail = NULL WHERE id = ?",
        (interrupted,),
    )
    rows = execute(url, "SELECT id, status, stop_cause, stop_step FROM runs ORDER BY id")
    by_id = {row[0]: row[1:] for row in rows}
    assert by_id[planned][0] == "running"
    assert by_id[running] == ("diverged", "loss_explosion", 12)
    assert by_id[interrupted] == ("running", None, None)


def test_one_control_per_campaign(seeded: dict) -> None:
    url = seeded["url"]
    campaign_id = execute(url, "SELECT id FROM campaigns")[0][0]
    with pytest.raises(REFUSAL_ERRORS):
        execute(
            url,
            "INSERT INTO variants (campaign_id, name, is_control, overrides) "
            "VALUES (?, 'second-control', ?, '{}')",
            (campaign_id, True),
        )


def test_metric_must_belong_to_its_segments_run(seeded: dict, ledger: Ledger) -> None:
    """Enforced by a composite foreign key. SQLite checks foreign keys only on
    connections that enable them; every ledger connection does."""
    url = seeded["url"]
    segment = execute(url, "SELECT id FROM segments WHERE run_id = ?", (seeded["running"],))[0][0]
    with pytest.raises(sqlalchemy.exc.IntegrityError), ledger.engine.begin() as conn:
        conn.execute(
            sqlalchemy.text(
                "INSERT INTO metrics (run_id, segment_id, key, step, value, wall_time) "
                "VALUES (:run, :segment, 'k', 1, 1.0, 0)"
            ),
            {"run": seeded["planned"], "segment": segment},
        )
