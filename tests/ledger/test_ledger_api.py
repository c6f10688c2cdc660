"""The Ledger API on both engines: planning, lifecycle, metric writer, reads."""

from __future__ import annotations

import math
import threading
import time

import pandas as pd
import pytest

from campaign.ledger import (
    IllegalTransition,
    Ledger,
    LedgerInputError,
    NotFound,
    RefusedWrite,
    StopRecord,
)
from campaign.ledger.canonical import sha256_text
from campaign.ledger.ids import RUN_ID_LENGTH, looks_like_run_id, new_run_id
from tests.support.helpers import plan_campaign
from tests.support.raw import execute


def test_plan_records_everything_in_one_go(ledger: Ledger, ledger_url: str) -> None:
    record = plan_campaign(ledger)
    assert len(record.run_ids) == 9 == len(set(record.run_ids))
    assert all(looks_like_run_id(r) for r in record.run_ids)
    assert record.spec_sha256 == sha256_text(record.spec)
    for config, digest in execute(ledger_url, "SELECT config, config_sha256 FROM runs"):
        assert sha256_text(config) == digest  # verifiable from plain SQL
    runs = ledger.runs("digits-lr")
    assert set(runs["status"]) == {"planned"}
    assert runs["is_control"].sum() == 3 and set(runs[runs.is_control].variant) == {"lr-1e-4"}
    assert runs.loc[0, "config"]["optimizer"]["name"] == "adamw"
    events = ledger.events("digits-lr")
    assert list(events["kind"]) == ["planned"] * 9


def test_plan_with_a_duplicate_name_writes_nothing(ledger: Ledger, ledger_url: str) -> None:
    plan_campaign(ledger)
    counts = [execute(ledger_url, f"SELECT COUNT(*) FROM {t}") for t in ("runs", "variants")]
    with pytest.raises(RefusedWrite, match=r"^recording campaign 'digits-lr': campaign ledger "
                       r"refused: "):  # the unique key (PostgreSQL) or the no-REPLACE rule
        plan_campaign(ledger)
    assert [
        execute(ledger_url, f"SELECT COUNT(*) FROM {t}") for t in ("runs", "variants")
    ] == counts


def test_run_ids_sort_by_creation_and_never_repeat() -> None:
    ids = [new_run_id() for _ in range(5000)]
    assert len(set(ids)) == len(ids) and ids == sorted(ids)
    assert all(len(i) == RUN_ID_LENGTH for i in ids)
    assert new_run_id(now_ms=1) < new_run_id(now_ms=2**47)


def test_lifecycle_with_events_in_the_same_transaction(ledger: Ledger) -> None:
    plan_campaign(ledger, seeds=1)
    claim = ledger.claim_next("digits-lr", "host:1:cpu")
    assert claim is not None and claim.ordinal == 1
    run = ledger.run(claim.run_id)
    assert run.status == "running" and run.worker == "host:1:cpu"
    assert run.heartbeat_at is not None and run.started_at is not None
    ledger.finish(claim.run_id, "diverged",
                  StopRecord("loss_explosion", 120, "forward", "loss 9.1 > 4 x 2.2"))
    run = ledger.run(claim.run_id)
    assert (run.status, run.stop_cause, run.stop_step, run.stop_phase) == (
        "diverged", "loss_explosion", 120, "forward")
    assert run.ended_at is not None and run.ended_at >= run.started_at
    kinds = list(ledger.events("digits-lr", run_id=claim.run_id)["kind"])
    assert kinds == ["planned", "running", "diverged"]
    segments = ledger.segments("digits-lr")
    assert segments.loc[0, "end_step"] == 120 and segments.loc[0, "ended_at"] is not None


def test_illegal_transitions_are_refused_with_a_reason(ledger: Ledger) -> None:
    plan_campaign(ledger, seeds=1)
    claim = ledger.claim_next("digits-lr", "w")
    with pytest.raises(LedgerInputError, match="does not fit status 'completed'"):
        ledger.finish(claim.run_id, "completed", StopRecord("out_of_memory"))
    with pytest.raises(LedgerInputError, match="not an end status"):
        ledger.finish(claim.run_id, "planned", StopRecord("exception"))
    with pytest.raises(IllegalTransition, match="already running"):
        ledger.start(claim.run_id, "w2")
    ledger.finish(claim.run_id, "oom", StopRecord("out_of_memory", 3, "validation"))
    with pytest.raises(IllegalTransition, match="terminal status: it is final"):
        ledger.start(claim.run_id, "w2")
    with pytest.raises(IllegalTransition, match="is oom, a terminal status"):
        ledger.finish(claim.run_id, "failed", StopRecord("exception"))
    assert ledger.run(claim.run_id).status == "oom"


def test_resume_opens_a_new_segment_and_clears_the_stop(ledger: Ledger) -> None:
    plan_campaign(ledger, seeds=1)
    claim = ledger.claim_next("digits-lr", "w1")
    ledger.finish(claim.run_id, "interrupted", StopRecord("preempted", 40, "update", "SIGTERM"))
    artifact = ledger.add_artifact(claim.run_id, "checkpoint", "/ckpt/40", "ab" * 32, 1, 40)
    resumed = ledger.start(claim.run_id, "w2", start_step=40, resumed_from=artifact)
    assert resumed.run_id == claim.run_id and resumed.ordinal == 2
    run = ledger.run(claim.run_id)
    assert run.status == "running" and run.stop_cause is None and run.worker == "w2"
    ledger.finish(claim.run_id, "completed", StopRecord("budget_reached", 200, "update"))
    kinds = list(ledger.events("digits-lr", run_id=claim.run_id)["kind"])
    assert kinds == ["planned", "running", "interrupted", "resumed", "completed"]
    segments = ledger.segments("digits-lr")
    assert list(segments["ordinal"]) == [1, 2]
    assert list(segments["resumed_from"]) == [None, artifact] or list(
        segments["resumed_from"].fillna(-1)) == [-1, artifact]


def test_heartbeat_only_for_running_runs(ledger: Ledger) -> None:
    record = plan_campaign(ledger, seeds=2, variants={"only": 1e-4})
    claim = ledger.claim_next("digits-lr", "w")
    first = ledger.run(claim.run_id).heartbeat_at
    time.sleep(0.02)
    assert ledger.heartbeat(claim.run_id) is True
    assert ledger.run(claim.run_id).heartbeat_at > first
    planned = next(r for r in record.run_ids if r != claim.run_id)
    assert ledger.heartbeat(planned) is False


def test_claims_never_hand_out_a_run_twice(ledger: Ledger, ledger_url: str) -> None:
    plan_campaign(ledger, seeds=10, variants={"a": 1e-4, "b": 2e-4, "c": 3e-4, "d": 4e-4})
    taken: list[str] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        while (claim := ledger.claim_next("digits-lr", name)) is not None:
            with lock:
                taken.append(claim.run_id)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(taken) == 40 == len(set(taken))
    assert execute(ledger_url, "SELECT COUNT(*) FROM events WHERE kind = 'running'") == [(40,)]
    assert ledger.claim_next("digits-lr", "late") is None


def test_metric_writer_flushes_by_size_time_and_close(ledger: Ledger, ledger_url: str) -> None:
    plan_campaign(ledger, seeds=1, variants={"only": 1e-4})
    claim = ledger.claim_next("digits-lr", "w")
    count = "SELECT COUNT(*) FROM metrics"
    writer = ledger.metric_writer(claim.run_id, claim.segment_id, batch_size=10, interval_s=3600)
    for step in range(9):
        writer.log("train/loss", step, 1.0)
    assert execute(ledger_url, count) == [(0,)] and writer.pending == 9
    writer.log("train/loss", 9, 1.0)
    assert execute(ledger_url, count) == [(10,)] and writer.pending == 0
    writer.interval_s = 0.05
    writer.log("train/loss", 10, 1.0)
    time.sleep(0.06)
    writer.log("train/loss", 11, 1.0)  # the interval passed: this call flushes
    assert execute(ledger_url, count) == [(12,)]
    writer.log_dict(12, {"train/loss": 0.5, "train/lr": 1e-4}, examples_seen=192)
    writer.close()
    assert execute(ledger_url, count) == [(14,)]


def test_non_finite_values_and_idempotent_rewrites(ledger: Ledger) -> None:
    plan_campaign(ledger, seeds=1, variants={"only": 1e-4})
    claim = ledger.claim_next("digits-lr", "w")
    with ledger.metric_writer(claim.run_id, claim.segment_id) as writer:
        writer.log("train/loss", 1, 2.0)
        writer.log("train/loss", 2, float("nan"))
        writer.log("train/loss", 3, float("inf"))
    with ledger.metric_writer(claim.run_id, claim.segment_id) as writer:
        writer.log("train/loss", 1, 2.0)  # a retried flush of the same point
    frame = ledger.metrics("digits-lr")
    assert list(frame["step"]) == [1, 2, 3]
    assert frame["value"][0] == 2.0 and math.isnan(frame["value"][1])
    assert math.isinf(frame["value"][2])


def test_reads_take_the_latest_segment_of_replayed_steps(ledger: Ledger) -> None:
    plan_campaign(ledger, seeds=1, variants={"only": 1e-4})
    first = ledger.claim_next("digits-lr", "w1")
    with ledger.metric_writer(first.run_id, first.segment_id) as writer:
        for step in range(10):
            writer.log("train/loss", step, 10.0 - step, examples_seen=16 * step)
    ledger.finish(first.run_id, "lost", StopRecord("heartbeat_lost", 9))
    second = ledger.start(first.run_id, "w2", start_step=5)
    with ledger.metric_writer(second.run_id, second.segment_id) as writer:
        for step in range(5, 15):
            writer.log("train/loss", step, 100.0 - step, examples_seen=16 * step)
    latest = ledger.metrics("digits-lr", keys=["train/loss"])
    assert list(latest["step"]) == list(range(15))
    assert list(latest["segment_id"]) == [first.segment_id] * 5 + [second.segment_id] * 10
    assert latest["value"].iloc[7] == 93.0
    both = ledger.metrics("digits-lr", all_segments=True)
    assert len(both) == 20
    table = ledger.comparison("digits-lr")
    assert table.loc[0, "train/loss"] == 86.0
    assert table.loc[0, "config.optimizer.lr"] == 1e-4


def test_relaunch_links_and_leaves_the_old_run_untouched(ledger: Ledger, ledger_url: str) -> None:
    record = plan_campaign(ledger, seeds=1, variants={"only": 1e-4})
    old = ledger.claim_next("digits-lr", "w")
    ledger.finish(old.run_id, "oom", StopRecord("out_of_memory", 3, "validation"))
    before = execute(ledger_url, "SELECT * FROM runs WHERE id = ?", (old.run_id,))
    with pytest.raises(LedgerInputError, match="needs a reason"):
        ledger.add_run("digits-lr", "only", 0, {"loop": {"microbatch": 1}}, relaunch_of=old.run_id)
    new = ledger.add_run("digits-lr", "only", 0, {"loop": {"microbatch": 1}},
                         relaunch_of=old.run_id, reason="OOM in validation")
    assert new != old.run_id and new not in record.run_ids
    assert execute(ledger_url, "SELECT * FROM runs WHERE id = ?", (old.run_id,)) == before
    relaunched = ledger.run(new)
    assert (relaunched.relaunch_of, relaunched.relaunch_reason, relaunched.status) == (
        old.run_id, "OOM in validation", "planned")
    runs = ledger.runs("digits-lr")
    assert set(runs["run_id"]) == {old.run_id, new}
    events = ledger.events("digits-lr")
    assert events["kind"].iloc[-1] == "planned" and old.run_id in events["detail"].iloc[-1]
    assert events["kind"].iloc[-2] == "relaunched" and events["run_id"].isna().iloc[-2]
    assert f"run {old.run_id} as {new}" in events["detail"].iloc[-2]


def test_unknown_names_are_bad_input(ledger: Ledger) -> None:
    with pytest.raises(NotFound, match="no campaign named 'nope'"):
        ledger.runs("nope")
    with pytest.raises(NotFound, match="no run '01zz'"):
        ledger.run("01zz")
    plan_campaign(ledger, seeds=1)
    with pytest.raises(LedgerInputError, match="unknown run status 'done'"):
        ledger.runs("digits-lr", status="done")
    assert len(ledger.runs("digits-lr", status=["planned", "running"])) == 3


def test_notes_pilots_phases_artifacts(ledger: Ledger) -> None:
    plan_campaign(ledger, seeds=1)
    ledger.add_note("digits-lr", "control kept: 2e-4 diverged on seed 1")
    ledger.add_note("digits-lr", "<b>escaped later</b>")
    assert next(iter(ledger.notes("digits-lr")["text"])).startswith("control kept")
    pilot = ledger.create_pilot("digits-lr", "ab" * 32, {"torch": "2.13.0"})
    ledger.add_phase_measurements([
        {"pilot_id": pilot, "phase": phase, "device": "cpu", "rss": 10 << 20,
         "rss_peak": 12 << 20, "duration_s": 0.01, "verdict": "pass",
         "inputs": {"shape": [2, 64]}}
        for phase in ("data", "forward", "backward")
    ])
    ledger.set_pilot_verdict(pilot, "pass")
    phases = ledger.phases("digits-lr")
    assert list(phases["phase"]) == ["data", "forward", "backward"]
    assert phases.loc[0, "inputs"] == {"shape": [2, 64]}
    claim = ledger.claim_next("digits-lr", "w")
    ledger.add_artifact(claim.run_id, "final", "/a/final.safetensors", "cd" * 32, 123, 200)
    assert ledger.artifacts("digits-lr").loc[0, "bytes"] == 123


def test_metric_writer_refuses_a_segment_of_another_run(ledger: Ledger) -> None:
    plan_campaign(ledger, seeds=2, variants={"only": 1e-4})
    first = ledger.claim_next("digits-lr", "w1")
    second = ledger.claim_next("digits-lr", "w2")
    writer = ledger.metric_writer(first.run_id, second.segment_id)
    writer.log("train/loss", 1, 1.0)
    with pytest.raises(RefusedWrite, match="is not a segment of run"):
        writer.flush()
    assert writer.pending == 1  # nothing lost: the caller still holds the point
    assert len(ledger.metrics("digits-lr")) == 0
    # The pooled connection went back with foreign key checks on again.
    with ledger.engine.connect() as conn:
        if ledger.dialect == "sqlite":
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_large_batches_repeated_after_an_ambiguous_commit(ledger: Ledger) -> None:
    """A whole batch written twice (the bulk path on PostgreSQL): no error, no duplicate."""
    plan_campaign(ledger, seeds=1, variants={"only": 1e-4})
    claim = ledger.claim_next("digits-lr", "w")
    for _ in range(2):
        with ledger.metric_writer(claim.run_id, claim.segment_id, batch_size=500) as writer:
            for step in range(1000):
                writer.log("train/loss", step, 1.0 / (step + 1))
    frame = ledger.metrics("digits-lr", all_segments=True)
    assert len(frame) == 1000 and frame["step"].is_unique


def test_runs_frame_with_some_documents_missing(ledger: Ledger) -> None:
    """One run has an environment, the others none: decoded dicts and None, never NaN."""
    plan_campaign(ledger, seeds=2, variants={"only": 1e-4})
    claim = ledger.claim_next("digits-lr", "w")
    ledger.set_environment(claim.run_id, {"torch": "2.13.0"})
    runs = ledger.runs("digits-lr").set_index("run_id")
    assert runs.loc[claim.run_id, "environment"] == {"torch": "2.13.0"}
    assert runs["environment"].map(lambda v: v is None or isinstance(v, dict)).all()


def test_run_rows_are_the_runs_frame_without_pandas(ledger: Ledger) -> None:
    """What `campaign runs` prints comes from plain rows: same values and types as the frame."""
    plan_campaign(ledger, seeds=2)
    claim = ledger.claim_next("digits-lr", "w1")
    ledger.finish(claim.run_id, "failed", StopRecord("exception", 3, "forward", "boom"))
    frame = ledger.runs("digits-lr")
    rows = ledger.run_rows("digits-lr")
    assert [r["run_id"] for r in rows] == list(frame["run_id"])
    for row, expected in zip(rows, frame.to_dict("records"), strict=True):
        for column in ("variant", "seed", "status", "stop_cause", "stop_step", "relaunch_of"):
            value = expected[column]
            assert row[column] == (None if pd.isna(value) else value), column
        assert row["config"] == expected["config"]
        assert isinstance(row["is_control"], bool) and row["is_control"] == expected["is_control"]
        assert row["created_at"] == expected["created_at"].to_pydatetime()
        assert row["created_at"].tzinfo is not None
    failed = ledger.run_rows("digits-lr", status="failed")
    assert [(r["run_id"], r["stop_step"]) for r in failed] == [(claim.run_id, 3)]
