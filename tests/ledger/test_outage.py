"""The ledger may blink (docs/runs.md, faults): its sessions killed under a training worker
(`pg_terminate_backend`), or its server restarted (`-m fast`, `-m immediate`) or stopped for
seconds, cost no run and no point. The worker, its supervisor and the run's process reconnect
with backoff; the run ends `completed` with the series of its uninterrupted twin, every
update's point written once. Sessions are killed only in this test's own database of the
local PostgreSQL; restarts happen to a private cluster the test makes on its own port
(tests/support/outages.py), never to the shared server. Real processes."""

from __future__ import annotations

import contextlib
import shlex
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, exc
from sqlalchemy.engine import make_url

from campaign.errors import LedgerUnreachable
from campaign.ledger import Ledger, outage, reach_probe
from campaign.ledger import metrics as metrics_module
from campaign.ledger.connections import run_in_transaction
from campaign.ledger.outage import Backoff, is_outage, outage_s, riding_out
from campaign.loop.train import execute
from tests.conftest import POSTGRES_ADMIN_URL
from tests.support.launch_helpers import last_step, losses, start, wait_for
from tests.support.loop_helpers import plan_quick
from tests.support.outages import (
    SKIP,
    SLOW,
    UPDATES,
    Cluster,
    assert_twin,
    free_port,
    outlived,
    points_through_a_crash,
    ridden_out,
    stopped_for,
)


def _terminate_sessions(database: str, stop: threading.Event, every_s: float) -> list[int]:
    """Kill every session of ``database`` but this one, every ``every_s``, until ``stop``."""
    killed: list[int] = []
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        while not stop.wait(every_s):
            rows = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()", (database,)).fetchall()
            killed.append(len(rows))
    return killed


@pytest.mark.slow
def test_a_worker_rides_out_its_sessions_being_killed(postgresql_ledger: Ledger,
                                                      postgresql_url: str,
                                                      tmp_path: Path) -> None:
    ledger = postgresql_ledger
    (twin,) = plan_quick(ledger, "twin", runs=1, updates=UPDATES, **SLOW)
    execute(ledger, twin, artifacts=tmp_path / "twin", replay_in_subprocess=False)
    (run_id,) = plan_quick(ledger, "blinks", runs=1, updates=UPDATES, **SLOW)
    worker = start(postgresql_url, "worker", "blinks", "--artifacts", str(tmp_path / "a"),
                   "--no-replay-check", *SKIP)
    wait_for(lambda: last_step(ledger, run_id) >= 3, 120, "update 3 of the run")
    stop, killed = threading.Event(), []
    database = str(make_url(postgresql_url).database)
    killer = threading.Thread(target=lambda: killed.extend(
        _terminate_sessions(database, stop, 0.4)))
    killer.start()
    try:
        _, stderr = worker.communicate(timeout=300)
    finally:
        stop.set()
        killer.join()
        if worker.poll() is None:
            worker.kill()
    assert sum(killed) >= 3, killed  # sessions really were killed while it trained
    assert worker.returncode == 0, stderr[-3000:]
    assert_twin(ledger, run_id, twin)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["restart -m fast", "restart -m immediate", "stop 30 s"])
def test_a_worker_rides_out_a_restart_of_its_server(private_cluster: Cluster,
                                                     tmp_path: Path, how: str) -> None:
    def disrupt() -> None:
        if how.startswith("restart"):
            private_cluster.ctl("restart", "-m", how.split()[-1])
        else:
            stopped_for(30, lambda: private_cluster.ctl("stop", "-m", "fast"),
                        lambda: private_cluster.ctl("start"))

    ridden_out(private_cluster.url, tmp_path, disrupt)


@pytest.mark.slow
def test_a_local_launch_rides_out_a_restart_of_its_server(private_cluster: Cluster,
                                                          tmp_path: Path) -> None:
    """The launcher polls the ledger too: it and its worker wait the restart out."""
    ridden_out(private_cluster.url, tmp_path,
               lambda: private_cluster.ctl("restart", "-m", "fast"),
               ("launch", "blinks", "--workers", "1"))


@pytest.fixture
def outside_any_outage(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process in no outage, and as it was after the test (the state is the process's)."""
    monkeypatch.setattr(outage, "_away_since", None)
    monkeypatch.setattr(outage, "_came_back_at", None)
    monkeypatch.setattr(outage, "_last_miss_s", 0.0)
    monkeypatch.setattr(reach_probe, "_probes", {})
    yield
    for probe in list(reach_probe._probes.values()):  # none asks on into later tests
        probe.stop()


def test_the_outage_budget_is_checked_and_bounded(monkeypatch: pytest.MonkeyPatch,
                                                  sqlite_url: str, outside_any_outage: None
                                                  ) -> None:
    from campaign.errors import LedgerError

    monkeypatch.setenv("CAMPAIGN_LEDGER_OUTAGE_S", "soon")
    with pytest.raises(LedgerError, match="CAMPAIGN_LEDGER_OUTAGE_S='soon'"):
        outage_s()
    monkeypatch.setenv("CAMPAIGN_LEDGER_OUTAGE_S", "1.0")
    with Ledger.open(sqlite_url, create=True) as ledger:
        backoff = Backoff(riding_out(ledger.engine))
        began = time.monotonic()
        waits = 0
        while backoff.wait():
            waits += 1
        assert waits == 2 and 0.7 <= time.monotonic() - began < 1.0  # 0.25 s, then 0.5 s
        assert not Backoff(ledger.engine).wait()  # a command the user waits on: at once


def test_one_outage_is_one_deadline_for_every_transaction_of_the_process(
        monkeypatch: pytest.MonkeyPatch, sqlite_url: str, outside_any_outage: None) -> None:
    """A process that waited the limit out gives up at once on its next transaction (a run
    that stopped for the outage, then its supervisor, then its worker do not each wait the
    limit again); an answer from the ledger ends the outage, and the next gets the limit."""
    monkeypatch.setenv("CAMPAIGN_LEDGER_OUTAGE_S", "1.5")
    away, tries = _counting_tries(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x")

    began = time.monotonic()
    assert _give_up_after(away) >= 0.7  # 0.25 s, 0.5 s, then the next wait would pass 1.5 s
    assert len(tries) == 3
    time.sleep(max(0.0, began + 1.6 - time.monotonic()))  # the process is past the limit
    _give_up_after(away)
    assert len(tries) == 4  # the same outage: one try, no second limit
    with Ledger.open(sqlite_url, create=True) as ledger:
        ledger.campaigns()  # an answer
    assert _give_up_after(away) >= 0.7 and len(tries) == 7


def _counting_tries(url: str) -> tuple[Any, list[int]]:
    """A riding-out engine on ``url`` and the list its connection attempts are counted in."""
    from sqlalchemy import event

    engine = create_engine(url)
    tries: list[int] = []
    event.listen(engine, "do_connect", lambda *args: tries.append(1))
    return riding_out(engine), tries


def _give_up_after(away: Any) -> float:
    """Seconds a read on ``away`` took to give up for the outage."""
    began = time.monotonic()
    with pytest.raises(LedgerUnreachable):
        run_in_transaction(away, lambda conn: conn.exec_driver_sql("SELECT 1"),
                           write=False, what="reading")
    return time.monotonic() - began


def test_the_probe_keeps_the_process_deadline_while_the_loop_skips_its_tries(
        monkeypatch: pytest.MonkeyPatch, outside_any_outage: None) -> None:
    """A run's loop does not try while the probe asks, and nothing else in a run's process
    meets the outage: the probe's own misses keep the process's one deadline, so the run's
    end (written riding out) does not wait a full limit again after a long outage."""
    monkeypatch.setenv("CAMPAIGN_LEDGER_OUTAGE_S", "1.0")
    away, tries = _counting_tries(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x")
    probe = reach_probe.probe_for(away)
    probe.went_away()
    time.sleep(1.3)  # the probe asked at 0, 0.25 and 0.75 s: the outage is 1.3 s old
    assert not probe.worth_trying() and len(tries) == 3
    _give_up_after(away)
    assert len(tries) == 4  # past the limit: one try, then at once



def test_a_forked_child_has_no_probe_of_its_parent(outside_any_outage: None) -> None:
    """A run forked by its task host while the host's probe asks: the probe's thread is not
    the child's, so the child's writers try for themselves until their own probe starts."""
    import os

    away, _ = _counting_tries(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x")
    reach_probe.probe_for(away).went_away()
    assert not reach_probe.probe_for(away).worth_trying()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's verdict is its exit code
        os._exit(0 if reach_probe.probe_for(away).worth_trying() else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0

@pytest.mark.slow  # one connect timeout (5 s), then the loop's flushes
def test_a_server_that_does_not_answer_never_stalls_the_training_loop(
        tmp_path: Path, outside_any_outage: None) -> None:
    """A server that takes the connection and never answers (a network cut, a machine lost)
    costs each try the whole connect timeout (5 s). After the first, a run's metric writer
    asks it from a thread: the loop's flushes return at once, and its points wait."""
    from campaign.ledger.connections import create_ledger_engine, parse_url
    from campaign.ledger.metrics import MetricWriter

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # the kernel completes each handshake; nobody ever answers
        url = f"postgresql+psycopg://postgres@127.0.0.1:{silent.getsockname()[1]}/ledger"
        engine = riding_out(create_ledger_engine(parse_url(url)))
        writer = MetricWriter(engine, "run", 1, interval_s=0.05, spill=tmp_path / "spill")
        began = time.monotonic()
        writer.log("train/loss", 1, 1.0)
        writer.flush()  # the first try: it waits the connect timeout out
        assert writer.away_s() > 0 and time.monotonic() - began >= 4
        longest, began = 0.0, time.monotonic()
        step = 1
        while time.monotonic() - began < 8:  # past the writer's 0.25 .. 5 s backoff
            step += 1
            before = time.monotonic()
            writer.log("train/loss", step, 1.0 / step)
            longest = max(longest, time.monotonic() - before)
            time.sleep(0.02)
        assert longest < 1.0, longest  # never a connect timeout in the loop
        assert writer.pending == step and writer.points_written == 0


def _error_of(engine: Any, *statements: str) -> exc.DBAPIError:
    with pytest.raises(exc.DBAPIError) as caught, engine.connect() as conn:
        for statement in statements:
            conn.exec_driver_sql(statement)
    return caught.value


def test_only_a_lost_or_absent_server_is_an_outage(postgresql_ledger: Ledger) -> None:
    """The server's answers (a cancelled statement, a lock not granted, a missing database)
    fail at once; a session cut under a statement and a port nobody listens on are waited
    for. Real errors of the real PostgreSQL, read as the retry policy reads them."""
    engine = postgresql_ledger.engine
    cancelled = _error_of(engine, "SET statement_timeout = 50", "SELECT pg_sleep(2)")
    with engine.connect() as holder, holder.begin():
        holder.exec_driver_sql("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
        not_granted = _error_of(engine, "SET lock_timeout = 50", "LOCK TABLE runs")
    cut = _error_of(engine, "SELECT pg_terminate_backend(pg_backend_pid())")
    absent = make_url(str(engine.url)).set(port=free_port())
    nobody = _error_of(create_engine(absent), "SELECT 1")
    no_database = _error_of(create_engine(engine.url.set(database="campaign_no_such_db")),
                            "SELECT 1")
    assert not is_outage(cancelled, "postgresql") and not is_outage(not_granted, "postgresql")
    assert not is_outage(no_database, "postgresql")
    assert is_outage(cut, "postgresql") and is_outage(nobody, "postgresql")


def test_a_connection_whose_answers_stopped_matching_is_an_outage() -> None:
    """Behind PgBouncer, a session killed mid-COMMIT left psycopg with two results for one
    command (InternalError, no SQLSTATE): read as a statement's fault, it failed a training
    run for good in the SLURM gauntlet. It is a connection to drop and try again."""
    from campaign.errors import LedgerUnreachable
    from campaign.ledger.connections import translate_error, wrapped_driver_error

    engine = create_engine("postgresql+psycopg://postgres@127.0.0.1:1/x")
    confused = psycopg.InternalError("received 2 results from command 'BEGIN'")
    assert is_outage(wrapped_driver_error(engine, confused, "BEGIN"), "postgresql")
    wrong = psycopg.InternalError("cannot use a closed cursor")  # a fault of ours: not waited
    assert not is_outage(wrapped_driver_error(engine, wrong, "SELECT 1"), "postgresql")
    # Past the patience, it ends the run as an outage does (a run `interrupted` with cause
    # ledger_unreachable, resumed), not as a ledger error that fails it for good.
    last = translate_error(wrapped_driver_error(engine, confused, "BEGIN"), engine.url, "x")
    assert isinstance(last, LedgerUnreachable)
    assert not isinstance(translate_error(wrapped_driver_error(engine, wrong, "SELECT 1"),
                                          engine.url, "x"), LedgerUnreachable)


def test_a_server_that_vanished_silently_is_noticed_within_a_minute(
        postgresql_ledger: Ledger) -> None:
    """A half-open connection (a node lost, a cable cut) would block for the kernel's ~15
    minutes; libpq is told to probe an idle one and to give up on an unacknowledged send."""
    with postgresql_ledger.engine.connect() as conn:
        given = conn.connection.driver_connection.info.get_parameters()
    assert given["keepalives"] == "1" and int(given["keepalives_idle"]) <= 10
    probes = int(given["keepalives_idle"]) + int(given["keepalives_interval"]) * int(
        given["keepalives_count"])
    assert probes <= 60 and int(given["tcp_user_timeout"]) <= 60_000


@pytest.mark.slow  # a private cluster of its own: ~10 s
def test_points_acknowledged_but_not_on_disk_survive_a_crash(
        private_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Metric batches commit before the server's log reaches its disk. Here the server is told
    to flush that log only every 10 s, a batch is written, and the server is stopped at once
    (`-m immediate`, a crash): it comes back without the batch. The writer kept it, and its
    next flush, finding its connection gone, writes it again: every point is there once."""
    monkeypatch.setenv("CAMPAIGN_LEDGER_OUTAGE_S", "60")
    assert points_through_a_crash(private_cluster, private_cluster.url) == list(range(1, 151))


@pytest.mark.slow  # a private cluster of its own: ~10 s
def test_a_runs_writer_keeps_its_points_through_an_outage_and_spills_them(
        private_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's metric writer does not wait for its ledger: while the server is stopped each
    flush returns at once, the points stay in memory, then (past the bound, 50 here) go to the
    run folder's spill file; once the server is back one flush writes them all, once, in
    order, and removes the file."""
    from campaign.ledger import spill

    monkeypatch.setattr(spill, "KEEP_IN_MEMORY", 50)
    monkeypatch.setattr(metrics_module, "KEEP_IN_MEMORY", 50)
    url = private_cluster.url
    with Ledger.open(url, create=True) as plain:
        (run_id,) = plan_quick(plain, "away", runs=1, updates=3)
    spill_file = tmp_path / spill.SPILL_NAME
    with Ledger.open(url, ride_out=True) as ledger:
        claim = ledger.claim_next("away", "w")
        assert claim is not None
        writer = ledger.metric_writer(run_id, claim.segment_id, lease=claim.lease,
                                      spill=spill_file, batch_size=10)
        for step in range(1, 11):
            writer.log("train/loss", step, 1.0 / step)
        private_cluster.ctl("stop", "-m", "fast")
        began = time.monotonic()
        for step in range(11, 131):  # every 10th log flushes: each returns at once
            writer.log("train/loss", step, 1.0 / step)
        assert time.monotonic() - began < 5  # training was never held up by the outage
        assert writer.away_s() > 0 and spill_file.exists()
        assert writer.pending < 50  # bounded: the rest is on disk
        private_cluster.ctl("start")
        wait_for(lambda: writer.flush() > 0 or writer.away_s() == 0, 60, "the ledger back",
                 every=0.5)
        writer.close()
        assert not spill_file.exists()
        points = ledger.metrics(runs=[run_id], keys=["train/loss"], all_segments=True)
    assert sorted(points["step"]) == list(range(1, 131))


@pytest.mark.slow
@pytest.mark.parametrize("command", ["worker", "launch"])
def test_past_the_limit_a_run_stops_at_a_checkpoint_and_its_end_waits_for_the_ledger(
        private_cluster: Cluster, tmp_path: Path, command: str) -> None:
    """CAMPAIGN_LEDGER_OUTAGE_S=5 and the server stopped for good: the run trains on, stops at
    its first checkpoint past 5 s away, and its worker, unable to write the end, leaves it in
    the run's folder and exits 3 (a launch too, printing the command that continues), never
    `failed`. Once the server is back the next worker (that command, for a launch) writes
    that end (`interrupted`/`ledger_unreachable`) and the points kept, then resumes the run,
    which ends as its twin."""
    url = private_cluster.url
    updates = {"runs": 1, "updates": 200, **SLOW}
    with Ledger.open(url, create=True) as ledger:
        (twin,) = plan_quick(ledger, "twin", **updates)
        execute(ledger, twin, artifacts=tmp_path / "twin", replay_in_subprocess=False)
        (run_id,) = plan_quick(ledger, "outlived", **updates)
        art = tmp_path / "a"
        how = ("launch", "outlived", "--workers", "1") if command == "launch" else (
            "worker", "outlived")
        worker = start(url, *how, "--artifacts", str(art), "--no-replay-check", *SKIP,
                       env={"CAMPAIGN_LEDGER_OUTAGE_S": "5"})
        stderr = outlived(worker, lambda: last_step(ledger, run_id) >= 3, "update 3 of the run",
                          private_cluster)
        assert (art / run_id / "pending-end.json").exists()
        private_cluster.ctl("start")
        wait_for(lambda: _answers(url), 60, "the server back")
        assert ledger.run(run_id).status == "running"  # nobody could write anything
        again = ("worker", "outlived", "--artifacts", str(art), "--no-replay-check",
                 "--resume-interrupted", *SKIP)
        if command == "launch":  # the line it printed, as a user would paste it
            (line,) = [x for x in stderr.splitlines() if "continue with: " in x]
            words = shlex.split(line.split("continue with: ", 1)[1])
            assert words[:3] == ["campaign", "launch", "outlived"] and "--resume-lost" in words
            again = tuple(words[1:])
        resumed = start(url, *again)
        _, stderr = resumed.communicate(timeout=300)
        assert resumed.returncode == 0, stderr[-3000:]
        ends = ledger.events("outlived", run_id=run_id)
        stopped = ends.loc[ends["kind"] == "interrupted", "detail"]
        assert len(stopped) == 1 and "ledger_unreachable" in stopped.iloc[0], ends
        first = ledger.segments("outlived").iloc[0]  # it trained on while the ledger was away
        assert first["end_step"] >= 10 and first["end_step"] % 5 == 0, first
        assert ledger.run(run_id).status == "completed"
        assert losses(ledger, run_id).equals(losses(ledger, twin))
        points = ledger.metrics(runs=[run_id], keys=["train/loss"])
        assert sorted(points["step"]) == list(range(1, 201))  # none lost


def _answers(url: str) -> bool:
    with contextlib.suppress(Exception), Ledger.open(url) as ledger:
        ledger.campaigns()
        return True
    return False
