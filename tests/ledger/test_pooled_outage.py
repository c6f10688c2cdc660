"""A ledger behind PgBouncer blinks in two more ways (docs/runs.md, faults): the pooler itself
restarts (every client connection cut), or the server behind it restarts while the pooler
hides it (a client idle between transactions sees nothing). Both are ridden out with the run's
series equal to its twin's and every point once; a metric batch the crashed server forgot is
written again although no connection of the writer was lost. A private PgBouncer in front of
a private cluster (tests/support/outages.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from campaign.ledger import Ledger
from tests.support.loop_helpers import plan_quick
from tests.support.outages import Bouncer, Cluster, ridden_out, stopped_for

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
    private_cluster.admin("ALTER SYSTEM SET wal_writer_delay = '10s'", "SELECT pg_reload_conf()")
    with Ledger.open(private_bouncer.url, create=True) as ledger:
        (run_id,) = plan_quick(ledger, "hidden", runs=1, updates=3)
    with Ledger.open(private_bouncer.url, ride_out=True) as ledger:
        claim = ledger.claim_next("hidden", "w")
        assert claim is not None
        writer = ledger.metric_writer(run_id, claim.segment_id, lease=claim.lease)
        for step in range(1, 101):
            writer.log("train/loss", step, 1.0 / step)
        assert writer.flush() == 100
        private_cluster.ctl("restart", "-m", "immediate")
        for step in range(101, 151):
            writer.log("train/loss", step, 1.0 / step)
        writer.close()
        points = ledger.metrics(runs=[run_id], keys=["train/loss"], all_segments=True)
    assert sorted(points["step"]) == list(range(1, 151))
