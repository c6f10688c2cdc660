"""A COMMIT whose answer is lost with its connection (an outage at the worst moment) is done
once: the retry recognises the write that took effect (campaign/ledger/settled.py) instead of
claiming a second run, refusing its own end as a lost lease, or writing an event twice. The
database is the real PostgreSQL; what is injected is only the loss of the server's answer,
after the server committed."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from campaign.ledger import Ledger
from campaign.ledger.records import StopRecord
from tests.support.loop_helpers import plan_quick


@pytest.fixture
def riding(postgresql_ledger: Ledger) -> Iterator[Ledger]:
    """The same database opened as a worker opens it: riding out outages."""
    with Ledger.open(str(postgresql_ledger.engine.url.render_as_string(hide_password=False)),
                     ride_out=True) as opened:
        yield opened


def _lose_next_commit_answer(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The next COMMIT reaches the server and commits; its answer never comes back (the
    connection is closed under it, as a restart would). Returns a counter of such losses."""
    dialect = ledger.engine.dialect
    committed = dialect.do_commit
    lost: list[int] = []

    def commit_then_lose(dbapi_connection: Any) -> None:
        committed(dbapi_connection)
        if not lost:
            lost.append(1)
            getattr(dbapi_connection, "dbapi_connection", dbapi_connection).close()
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(dialect, "do_commit", commit_then_lose)
    return lost


def _twice(ledger: Ledger, monkeypatch: pytest.MonkeyPatch, write: Callable[[], Any]) -> Any:
    lost = _lose_next_commit_answer(ledger, monkeypatch)
    result = write()
    assert lost == [1], "the injected loss never happened: the test proves nothing"
    return result


def test_a_claim_whose_commit_answer_was_lost_is_one_claim(
    riding: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = plan_quick(riding, "lostcommit", runs=2, updates=3)
    claim = _twice(riding, monkeypatch, lambda: riding.claim_next("lostcommit", "w1"))
    assert claim is not None and claim.run_id == first
    assert riding.run(second).status == "planned"  # not claimed as well
    assert [r.status for r in (riding.run(first),)] == ["running"]
    segments = riding.segments("lostcommit")
    assert len(segments) == 1 and segments.iloc[0]["segment_id"] == claim.segment_id
    events = riding.events("lostcommit")
    assert (events["kind"] == "running").sum() == 1
    assert riding.heartbeat(first, lease=claim.lease)  # the lease returned is the one held


def test_an_end_whose_commit_answer_was_lost_is_not_refused(
    riding: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    (run_id,) = plan_quick(riding, "lostend", runs=1, updates=3)
    claim = riding.claim_next("lostend", "w1")
    assert claim is not None
    stop = StopRecord("budget_reached", step=3)
    _twice(riding, monkeypatch,
           lambda: riding.finish(run_id, "completed", stop, lease=claim.lease))
    assert riding.run(run_id).status == "completed"
    events = riding.events("lostend")
    assert (events["kind"] == "completed").sum() == 1


def test_events_and_artifacts_whose_commit_answer_was_lost_are_written_once(
    riding: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    (run_id,) = plan_quick(riding, "lostrows", runs=1, updates=3)
    claim = riding.claim_next("lostrows", "w1")
    assert claim is not None
    _twice(riding, monkeypatch, lambda: riding.add_event("lostrows", "note_kind", "once",
                                                          run_id, lease=claim.lease))
    events = riding.events("lostrows")
    assert (events["kind"] == "note_kind").sum() == 1
    artifact = _twice(riding, monkeypatch, lambda: riding.add_artifact(
        run_id, "checkpoint", "ckpt/3", "ab" * 32, 10, 3, lease=claim.lease))
    artifacts = riding.artifacts("lostrows")
    assert list(artifacts["id"]) == [artifact]


def test_without_the_check_the_loss_would_have_doubled_the_claim(
    riding: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The injected loss really does commit first: a claim repeated blindly (no settled
    check, as before) takes a second run. This is what the checks above prevent."""
    from campaign.ledger.claims import claim_next_without_commit
    from campaign.ledger.connections import run_in_transaction
    from campaign.ledger.leases import new_lease_token

    plan_quick(riding, "blind", runs=2, updates=3)
    campaign_id = int(riding.campaign("blind").id)
    _lose_next_commit_answer(riding, monkeypatch)
    run_in_transaction(riding.engine, lambda c: claim_next_without_commit(
        c, campaign_id, "w1", new_lease_token()), write=True, what="a blind claim")
    assert sorted(r.status for r in riding.runs("blind").itertuples()) == ["running", "running"]


def test_a_waiting_record_whose_commit_answer_was_lost_is_recorded_once(
    riding: Ledger, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A checkpoint's record tried at once during an outage (impatient) whose COMMIT took
    effect unanswered stays waiting, in the run folder too; the next try recognises it by the
    first attempt's mark instead of recording it twice."""
    from campaign.loop.ledger_away import WAITING_NAME, WaitingRecords

    (run_id,) = plan_quick(riding, "waits", runs=1, updates=3)
    claim = riding.claim_next("waits", "w1")
    assert claim is not None
    checkpoint = tmp_path / "step-2.safetensors"
    checkpoint.write_bytes(b"weights")
    waiting = WaitingRecords(riding, run_id, tmp_path)
    lost = _lose_next_commit_answer(riding, monkeypatch)
    waiting.file("checkpoint", checkpoint, 2, claim.lease)
    assert lost and len(waiting.pending) == 1 and (tmp_path / WAITING_NAME).exists()
    waiting.flush(claim.lease)
    assert not waiting.pending and not (tmp_path / WAITING_NAME).exists()
    assert list(riding.artifacts("waits")["step"]) == [2]


def test_a_spill_file_gives_each_segment_only_its_own_points(riding: Ledger,
                                                             tmp_path: Path) -> None:
    """Points a process whose lease is gone appended to the run folder's spill file after a
    new segment adopted it are not written into the run (nor under the new lease)."""
    from campaign.ledger.spill import SpillFile

    (run_id,) = plan_quick(riding, "spilt", runs=1, updates=9)
    first = riding.claim_next("spilt", "w1")
    assert first is not None
    riding.finish(run_id, "interrupted", StopRecord("preempted", 0, "train", "a test"),
                  lease=first.lease)
    second = riding.start(run_id, "w2", start_step=4)
    spill = SpillFile(tmp_path / "metrics-spill.jsonl")
    spill.append([(run_id, second.segment_id, "train/loss", 5, 0.5, None, 1.0),
                  (run_id, first.segment_id, "train/loss", 7, 0.7, None, 1.0)])  # the stale
    with riding.metric_writer(run_id, second.segment_id, lease=second.lease,
                              spill=spill.path) as writer:
        assert writer.write_spilled() == 1
    points = riding.metrics(runs=[run_id], keys=["train/loss"], all_segments=True)
    assert list(points["step"]) == [5]
    # The stale point stays for the next resume to judge (a dead process may have left an
    # ended segment's points unadopted); one from step 4 does not take an update it retrains.
    assert [row[3] for batch in spill.batches(10) for row in batch] == [7]
    riding.finish(run_id, "interrupted", StopRecord("preempted", 5, "train", "a test"),
                  lease=second.lease)
    third = riding.start(run_id, "w3", start_step=4)
    with riding.metric_writer(run_id, third.segment_id, lease=third.lease,
                              spill=spill.path) as writer:
        writer.adopt_spilled(4)
        assert writer.write_spilled() == 0 and not spill


def _left_waiting(folder: Path, run_id: str, lease: str | None, checkpoint: Path,
                  mark: int | None) -> None:
    """The run folder's waiting file as a run's process leaves it when it dies."""
    from campaign.loop.checkpoint_file import file_sha256
    from campaign.loop.ledger_away import WAITING_NAME

    item = {"file": "checkpoint", "path": str(checkpoint), "step": 2,
            "sha256": file_sha256(checkpoint), "mark": mark}
    (folder / WAITING_NAME).write_text(json.dumps({"run_id": run_id, "lease": lease,
                                                   "pending": [item]}))


def test_a_record_a_killed_process_committed_but_still_listed_is_written_once(
    riding: Ledger, tmp_path: Path
) -> None:
    """A run's process killed between a record's COMMIT and rewriting its waiting file (or
    before its first attempt kept a mark) leaves the record listed: whoever writes what it
    left finds it in the ledger instead of recording it twice."""
    from campaign.loop.ledger_away import WAITING_NAME, record_left_waiting
    from campaign.loop.run_files import record_file

    (run_id,) = plan_quick(riding, "killedwaits", runs=1, updates=3)
    claim = riding.claim_next("killedwaits", "w1")
    assert claim is not None
    checkpoint = tmp_path / "step-2.safetensors"
    checkpoint.write_bytes(b"weights")
    record_file(riding, run_id, "checkpoint", checkpoint, 2, lease=claim.lease)
    _left_waiting(tmp_path, run_id, claim.lease, checkpoint, mark=None)
    record_left_waiting(riding, tmp_path, run_id, claim.lease)
    assert list(riding.artifacts("killedwaits")["step"]) == [2]
    assert not (tmp_path / WAITING_NAME).exists()


def test_records_left_under_an_ended_lease_are_not_the_next_segments(
    riding: Ledger, tmp_path: Path
) -> None:
    """A waiting file an earlier segment's process left is not written under a later lease
    (its run moved on; a resume trusts only what its own segments recorded): it goes."""
    from campaign.loop.ledger_away import WAITING_NAME, record_left_waiting

    (run_id,) = plan_quick(riding, "stalewaits", runs=1, updates=3)
    claim = riding.claim_next("stalewaits", "w1")
    assert claim is not None
    checkpoint = tmp_path / "step-2.safetensors"
    checkpoint.write_bytes(b"weights")
    _left_waiting(tmp_path, run_id, "an-ended-lease", checkpoint, mark=None)
    record_left_waiting(riding, tmp_path, run_id, claim.lease)
    assert riding.artifacts("stalewaits").empty and not (tmp_path / WAITING_NAME).exists()


def test_a_ledger_refusing_a_left_record_is_heard_not_swallowed(
    riding: Ledger, tmp_path: Path
) -> None:
    """Only a missing or unreadable waiting file is nothing to do; the ledger's own refusal
    (here: a run it does not hold) reaches the caller like any write's."""
    from campaign.errors import NotFound
    from campaign.loop.ledger_away import record_left_waiting

    checkpoint = tmp_path / "step-2.safetensors"
    checkpoint.write_bytes(b"weights")
    _left_waiting(tmp_path, "no-such-run", None, checkpoint, mark=None)
    with pytest.raises(NotFound, match="no-such-run"):
        record_left_waiting(riding, tmp_path, "no-such-run", None)
