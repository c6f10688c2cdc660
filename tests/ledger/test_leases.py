"""Lost runs and stale workers: kill -9, heartbeat limits, resume, SIGSTOP/SIGCONT."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pandas as pd
import psycopg
import pytest

from campaign.ledger import Ledger
from campaign.loop.train import execute
from tests.support.launch_helpers import invoke, last_step, losses, start, wait_for
from tests.support.loop_helpers import plan_quick

# Short enough to keep the tests quick, long enough that a heartbeat thread starved by the
# other test workers on a 2-core machine is not mistaken for a dead worker.
LEASE = ("--heartbeat-s", "0.5", "--lease-s", "5")
SKIP = ("--skip-pilot", "--reason", "lease test")
SLOW = {"task": {"sleep_s": 0.02}, "hold": {"loop.checkpoint_every": 5}, "validation_every": 3}


def _gated(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    """A gate file (absent) and the slow settings that name it: a test creates the file the
    moment it sees the update it waits for, so the run holds there (its heartbeat goes on)
    and cannot end before the worker is stopped or killed, however loaded the machine. A
    checkpoint every 10 updates: one after update 10, the next far past where the tests
    hold the run, so updates after the last checkpoint are lost to the crash and replayed."""
    gate = tmp_path / "gate"
    return gate, {**SLOW, "task": {**SLOW["task"], "gate": str(gate)},
                  "hold": {"loop.checkpoint_every": 10}}


def _reference(ledger: Ledger, tmp_path: Path, updates: int) -> pd.Series:
    """The same config run uninterrupted in this process."""
    (run_id,) = plan_quick(ledger, "reference", runs=1, updates=updates, **_gated(tmp_path)[1])
    execute(ledger, run_id, artifacts=tmp_path / "reference", replay_in_subprocess=False)
    return losses(ledger, run_id)


def _declared_lost(ledger: Ledger, run_id: str, limit_s: float = 5) -> bool:
    ledger.mark_lost(limit_s)
    return ledger.run(run_id).status == "lost"


def _wait_lost(ledger: Ledger, run_id: str, limit_s: float = 5) -> None:
    """Until the sweep declares the run lost; a timeout says where the run stands."""
    try:
        wait_for(lambda: _declared_lost(ledger, run_id, limit_s), 30,
                 "the run to be declared lost")
    except AssertionError as timeout:
        record = ledger.run(run_id)
        raise AssertionError(f"{timeout}; the run is {record.status} ({record.stop_cause}), "
                             f"last update {last_step(ledger, run_id)}") from None


@pytest.mark.slow
def test_kill_9_mid_run_is_lost_then_resume_matches_an_uninterrupted_run(
    ledger: Ledger, ledger_url: str, tmp_path: Path
) -> None:
    reference = _reference(ledger, tmp_path, updates=30)
    gate, slow = _gated(tmp_path)
    (run_id,) = plan_quick(ledger, "crash", runs=1, updates=30, **slow)
    artifacts = str(tmp_path / "artifacts")
    worker = start(ledger_url, "worker", "crash", "--artifacts", artifacts, *LEASE, *SKIP,
                   "--no-replay-check")
    wait_for(lambda: last_step(ledger, run_id) >= 12, 120, "update 12 of the run")
    gate.touch()
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)
    _wait_lost(ledger, run_id)
    gate.unlink()
    first = ledger.metrics(runs=[run_id], keys=["train/loss"], all_segments=True)

    record = ledger.run(run_id)
    assert (record.status, record.stop_cause) == ("lost", "heartbeat_lost")
    # Declared by the staleness rule (no heartbeat past the limit), not by anyone's guess.
    assert "no heartbeat for" in record.stop_detail and "(limit 5 s)" in record.stop_detail

    resumed = invoke(ledger_url, "resume", run_id, "--artifacts", artifacts)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert ledger.run(run_id).status == "completed"

    # The final series equals the uninterrupted run's, bit for bit (float64 on CPU).
    pd.testing.assert_series_equal(losses(ledger, run_id), reference, check_exact=True)
    # The new segment started at the last checkpoint and replayed the steps after it; the
    # replayed values are kept under the new segment and equal the originals.
    segments = ledger.segments("crash").sort_values("ordinal")
    assert list(segments["ordinal"]) == [1, 2]
    old_id, new_id = segments["segment_id"]
    restart = int(segments["start_step"].iloc[1])
    assert restart > 0 and restart % 5 == 0
    points = ledger.metrics(runs=[run_id], keys=["train/loss"], all_segments=True)
    before = first[first["step"] > restart].set_index("step")["value"]
    assert len(before) > 0  # the crash lost steps after the checkpoint: they were replayed
    replayed = points[points["segment_id"] == new_id].set_index("step")["value"]
    pd.testing.assert_series_equal(replayed.loc[before.index], before, check_exact=True)
    assert (points[points["segment_id"] == old_id]["step"] <= int(first["step"].max())).all()
    every = ledger.metrics(runs=[run_id], all_segments=True)
    assert not every.duplicated(["segment_id", "key", "step"]).any()
    events = ledger.events("crash", run_id)
    lifecycle = [k for k in events["kind"] if k != "pilot_skipped"]  # the skip is per run
    assert lifecycle[:4] == ["planned", "running", "lost", "resumed"]
    check = events[events["kind"] == "determinism_check"]["detail"].iloc[0]
    assert "(identical)" in check


@pytest.mark.slow
def test_stale_worker_woken_after_reclaim_writes_nothing_and_exits(
    postgresql_ledger: Ledger, postgresql_url: str, tmp_path: Path
) -> None:
    """On PostgreSQL, the ledger that several machines share."""
    ledger, ledger_url = postgresql_ledger, postgresql_url
    gate, slow = _gated(tmp_path)
    (run_id,) = plan_quick(ledger, "stale", runs=1, updates=30, **slow)
    artifacts = str(tmp_path / "artifacts")
    sleeper = start(ledger_url, "worker", "stale", "--artifacts", artifacts, *LEASE, *SKIP,
                    "--no-replay-check")
    wait_for(lambda: last_step(ledger, run_id) >= 7, 120, "update 7 of the run")
    gate.touch()
    sleeper.send_signal(signal.SIGSTOP)
    try:
        _wait_lost(ledger, run_id)
        gate.unlink()  # for the resume
        other = invoke(ledger_url, "worker", "stale", "--artifacts", artifacts, *LEASE,
                       "--resume-lost", "--no-replay-check")
        assert other.returncode == 0, other.stderr[-2000:]
        assert ledger.run(run_id).status == "completed"
        segments = ledger.segments("stale")
        first_segment = int(segments[segments["ordinal"] == 1]["segment_id"].iloc[0])
        points = ledger.metrics(runs=[run_id], all_segments=True)
        written_before = int((points["segment_id"] == first_segment).sum())
        artifacts_before = len(ledger.artifacts("stale"))
        events_before = len(ledger.events("stale"))
    finally:
        gate.unlink(missing_ok=True)
        sleeper.send_signal(signal.SIGCONT)
    _, stderr = sleeper.communicate(timeout=120)

    assert sleeper.returncode == 3, stderr
    assert "lease" in stderr and "Traceback" not in stderr
    # Its writes were refused: the ledger holds exactly one result for the run.
    points = ledger.metrics(runs=[run_id], all_segments=True)
    assert int((points["segment_id"] == first_segment).sum()) == written_before
    assert len(ledger.artifacts("stale")) == artifacts_before
    assert len(ledger.events("stale")) == events_before
    events = ledger.events("stale", run_id)
    assert list(events["kind"]).count("completed") == 1
    record = ledger.run(run_id)
    assert (record.status, record.stop_step) == ("completed", 30)
    finals = ledger.artifacts("stale")
    assert len(finals[finals["kind"] == "final"]) == 1


def test_a_paused_transaction_never_blocks_the_sweep(
    postgresql_ledger: Ledger, postgresql_url: str
) -> None:
    """A worker paused inside a transaction holds its run's row: the sweep skips the run
    instead of waiting, and takes it once the server has ended the paused session (the
    ledger's sessions are ended after 10 s idle in a transaction)."""
    ledger = postgresql_ledger
    with ledger.engine.connect() as conn:
        limit = conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar()
    assert limit == "10s"
    (run_id,) = plan_quick(ledger, "paused", runs=1)
    ledger.claim_next("paused", "host:1:cpu")
    paused = psycopg.connect(postgresql_url.replace("+psycopg", ""))
    paused.execute("SET idle_in_transaction_session_timeout = '1s'")  # the worker's, shortened
    paused.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (run_id,))  # mid-write
    began = time.monotonic()
    assert ledger.mark_lost(0.001) == []  # skipped, not waited for
    assert time.monotonic() - began < 5, "the sweep waited behind the paused transaction"
    _wait_lost(ledger, run_id, 0.001)
    with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
        paused.execute("SELECT 1")  # the server ended the paused session
