"""A ledger behind PgBouncer blinks in two more ways (docs/runs.md, faults): the pooler itself
restarts (every client connection cut), or the server behind it restarts while the pooler
hides it (a client idle between transactions sees nothing). Both are ridden out with the run's
series equal to its twin's and every point once; a metric batch the crashed server forgot is
written again although no connection of the writer was lost. A private PgBouncer in front of
a private cluster (tests/support/outages.py)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from campaign.ledger import Ledger, outage
from campaign.loop.train import execute
from tests.support.launch_helpers import last_step, start, wait_for
from tests.support.loop_helpers import plan_quick
from tests.support.outages import (
    SKIP,
    SLOW,
    UPDATES,
    Bouncer,
    Cluster,
    assert_twin,
    crash_writer,
    points_through_a_crash,
    ridden_out,
    stopped_for,
)

pytestmark = pytest.mark.engine


@pytest.mark.slow
def test_a_worker_rides_out_a_restart_of_its_pooler(private_bouncer: Bouncer,
                                                    tmp_path: Path) -> None:
    ridden_out(private_bouncer.url, tmp_path,
               lambda: stopped_for(2, private_bouncer.stop, private_bouncer.start))


@pytest.mark.slow
def test_a_worker_rides_out_a_crash_of_the_server_behind_its_pooler(
        private_cluster: Cluster, private_bouncer: Bouncer, tmp_path: Path) -> None:
    ridden_out(private_bouncer.url, tmp_path,
               lambda: private_cluster.ctl("restart", "-m", "immediate"))


def test_points_the_server_forgot_behind_a_pooler_are_written_again(
        private_cluster: Cluster, private_bouncer: Bouncer) -> None:
    """The server flushes its log every 10 s; a batch is acknowledged, the server crashes and
    comes back; the pooler gives the writer's next transaction a new server connection, so
    nothing failed on the writer's side. It sees the server's new start time and writes its
    kept batch again."""
    assert points_through_a_crash(private_cluster, private_bouncer.url) == list(range(1, 151))


@pytest.mark.parametrize("via", ["server", "pooler"])
def test_the_last_batch_survives_a_crash_right_after_the_writer_closed(
        private_cluster: Cluster, private_bouncer: Bouncer, tmp_path: Path, via: str) -> None:
    """Batches commit asynchronously and a writer keeps them until a later flush finds the
    server lost none; its last one, written by close() at the run's end, has no later flush.
    It commits synchronously instead: a crash just after it loses nothing (the ledger gauntlet
    lost updates 31..80 of a completed run here once, on a loaded machine)."""
    url = private_cluster.url if via == "server" else private_bouncer.url
    spill = tmp_path / "metrics-spill.jsonl"  # as a run's process opens its writer
    with crash_writer(private_cluster, url, spill) as (ledger, run_id, writer):
        for step in range(1, 31):
            writer.log("train/loss", step, 1.0 / step)
        assert writer.flush() == 30
        for step in range(31, 81):  # the last points, written by close() at the run's end
            writer.log("train/loss", step, 1.0 / step)
        writer.close()
        writer.write_spilled()  # as the run's end does (nothing spilled)
        private_cluster.ctl("restart", "-m", "immediate")  # the gauntlet's crash
        points = ledger.metrics(runs=[run_id], keys=["train/loss"], all_segments=True)
    assert sorted(points["step"]) == list(range(1, 81))


@pytest.mark.slow
def test_no_run_is_declared_lost_on_a_heartbeat_stale_only_from_an_outage(
        private_bouncer: Bouncer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pooler is down for 8 s, longer than the 5 s lease, and the training worker is slow
    to come back (its processes paused through the outage and 3 s past it, as a backoff's
    sleep would keep them). A sweeper that waited the outage out (here the test, as a launcher
    or an idle worker would) must not declare the run lost the moment the ledger answers: the
    run's own process gets a full lease to beat again. It does, and the run ends as its twin,
    never lost, trained by one process."""
    url = private_bouncer.url
    with Ledger.open(url, create=True) as ledger:
        (twin,) = plan_quick(ledger, "twin", runs=1, updates=UPDATES, **SLOW)
        execute(ledger, twin, artifacts=tmp_path / "twin", replay_in_subprocess=False)
        (run_id,) = plan_quick(ledger, "blinks", runs=1, updates=UPDATES, **SLOW)
    worker = start(url, "worker", "blinks", "--artifacts", str(tmp_path / "a"),
                   "--no-replay-check", "--heartbeat-s", "0.5", "--lease-s", "5", *SKIP)

    def signal_all(signum: int) -> None:  # the worker, the run's process, its task host
        tree = psutil.Process(worker.pid)
        for process in [tree, *tree.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signum)

    def blackout() -> None:
        signal_all(signal.SIGSTOP)
        stopped_for(8, private_bouncer.stop, private_bouncer.start)
        time.sleep(3)
        signal_all(signal.SIGCONT)

    # The sweeper retries every 0.1 s, so it is back within a fraction of a second of the
    # ledger (a launcher's backoff may wait up to 5 s): the race, made certain.
    monkeypatch.setattr(outage, "FIRST_WAIT_S", 0.1)
    monkeypatch.setattr(outage, "LONGEST_WAIT_S", 0.1)
    declared: list[str] = []
    with Ledger.open(url, ride_out=True) as sweeper:
        try:
            wait_for(lambda: last_step(sweeper, run_id) >= 3, 120, "update 3 of the run")
            disrupting = threading.Thread(target=blackout)
            disrupting.start()
            while disrupting.is_alive() or worker.poll() is None:  # sweeps as a launcher does
                declared += [lost.run_id for lost in sweeper.mark_lost(5, "blinks")]
                time.sleep(0.1)
            disrupting.join()
            _, stderr = worker.communicate(timeout=300)
        finally:
            if worker.poll() is None:
                signal_all(signal.SIGCONT)
                worker.kill()
        assert declared == [], "a run was declared lost on a heartbeat the outage made stale"
        assert worker.returncode == 0, stderr[-3000:]
        assert "lost" not in set(sweeper.events("blinks", run_id=run_id)["kind"])
        assert_twin(sweeper, run_id, twin)
