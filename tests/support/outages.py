"""A ledger server of a test's own, to restart, stop and crash: a private PostgreSQL cluster
(Debian's pg_createcluster) on a free port and, in front of it, a private PgBouncer in
transaction mode, each dropped afterwards; and the check every outage test makes: a run
trained through the outage ends as its uninterrupted twin, every point once. Never the shared
server (docs/runs.md, faults)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import psycopg
import pytest

from campaign.ledger import Ledger
from tests.conftest import REQUIRE_ALL
from tests.support.launch_helpers import last_step, losses, start, wait_for
from tests.support.loop_helpers import plan_quick

SKIP = ("--skip-pilot", "--reason", "a test of ledger outages")
SLOW = {"task": {"sleep_s": 0.02}, "hold": {"loop.checkpoint_every": 5}, "validation_every": 3}
UPDATES = 30


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Cluster:
    """A private PostgreSQL cluster: ``url`` of its ``ledger`` database."""

    version: str
    name: str
    port: int

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/ledger"

    def ctl(self, *action: str) -> None:
        subprocess.run(["pg_ctlcluster", self.version, self.name, *action], check=True,
                       capture_output=True, timeout=120)

    def admin(self, *statements: str) -> None:
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.port}/postgres",
                             autocommit=True) as admin:
            for statement in statements:
                admin.execute(statement)  # type: ignore[arg-type]


@pytest.fixture
def private_cluster() -> Iterator[Cluster]:
    """A PostgreSQL cluster of this test's own on a free port, with a ``ledger`` database."""
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[-1]
    cluster = Cluster(version, f"campaign{uuid.uuid4().hex[:8]}", free_port())
    subprocess.run(["pg_createcluster", version, cluster.name, "-p", str(cluster.port), "--",
                    "--auth-host=trust", "--auth-local=trust"],
                   check=True, capture_output=True, timeout=120)
    try:
        cluster.ctl("start")
        cluster.admin("CREATE DATABASE ledger")
        yield cluster
    finally:
        subprocess.run(["pg_dropcluster", "--stop", version, cluster.name],
                       capture_output=True, timeout=120)


@dataclass
class Bouncer:
    """A private PgBouncer in transaction mode in front of a private cluster."""

    folder: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/ledger"

    def start(self) -> None:
        subprocess.run(["pgbouncer", "-d", "-u", "postgres", str(self.folder / "pgbouncer.ini")],
                       check=True, capture_output=True, timeout=60)
        wait_for(self._answers, 30, "the private PgBouncer to answer")

    def stop(self) -> None:
        """SIGTERM: PgBouncer exits at once, cutting every client (a crash, or a restart)."""
        pid_file = self.folder / "pgbouncer.pid"
        if not pid_file.exists():
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        wait_for(lambda: not pid_file.exists(), 30, "the private PgBouncer to exit")

    def _answers(self) -> bool:
        done = subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                              capture_output=True, timeout=30)
        return done.returncode == 0


@pytest.fixture
def private_bouncer(private_cluster: Cluster) -> Iterator[Bouncer]:
    """PgBouncer (Debian's package, installed by scripts/test-services) on a free port. It
    runs as the postgres user, so its folder is one that user may enter (not pytest's)."""
    if shutil.which("pgbouncer") is None:
        if REQUIRE_ALL:  # `make test` installs it (scripts/test-services)
            raise RuntimeError("CAMPAIGN_REQUIRE_ALL is set but pgbouncer is not installed")
        pytest.skip("capability: no pgbouncer on this machine (scripts/test-services)")
    folder = Path(tempfile.mkdtemp(prefix="campaign-pgbouncer-"))
    bouncer = Bouncer(folder, free_port())
    (folder / "pgbouncer.ini").write_text(
        f"[databases]\n* = host=127.0.0.1 port={private_cluster.port}\n\n[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {bouncer.port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder}/users.txt\npool_mode = transaction\n"
        "ignore_startup_parameters = options,extra_float_digits\nserver_reset_query =\n"
        f"logfile = {folder}/pgbouncer.log\npidfile = {folder}/pgbouncer.pid\n")
    (folder / "users.txt").write_text('"postgres" ""\n')
    subprocess.run(["chown", "-R", "postgres", str(folder)], check=True)
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(folder, ignore_errors=True)


def ridden_out(url: str, tmp_path: Path, disrupt: Callable[[], None],
               command: tuple[str, ...] = ("worker", "blinks"), updates: int = UPDATES,
               slow: dict[str, Any] = SLOW) -> None:
    """``command`` (a worker, or a launch and its workers) trains a run on ``url``;
    ``disrupt()`` at update 3; the run must end as its twin (trained uninterrupted on the
    same ledger first), every point once."""
    from campaign.loop.train import execute

    with Ledger.open(url, create=True) as ledger:
        (twin,) = plan_quick(ledger, "twin", runs=1, updates=updates, **slow)
        execute(ledger, twin, artifacts=tmp_path / "twin", replay_in_subprocess=False)
        (run_id,) = plan_quick(ledger, "blinks", runs=1, updates=updates, **slow)
        worker = start(url, *command, "--artifacts", str(tmp_path / "a"), "--no-replay-check",
                       *SKIP)
        try:
            wait_for(lambda: last_step(ledger, run_id) >= 3, 120, "update 3 of the run")
            disrupt()
            _, stderr = worker.communicate(timeout=300)
        finally:
            if worker.poll() is None:
                worker.kill()
        assert worker.returncode == 0, stderr[-3000:]
        assert_twin(ledger, run_id, twin, updates)


def assert_twin(ledger: Ledger, run_id: str, twin: str, updates: int = UPDATES) -> None:
    """Completed, every update's point once, the twin's series bit for bit."""
    record = ledger.run(run_id)
    assert (record.status, record.stop_cause) == ("completed", "budget_reached"), record
    points = ledger.metrics(runs=[run_id], keys=["train/loss"], all_segments=True)
    assert sorted(points["step"]) == list(range(1, updates + 1))  # none lost, none twice
    pd.testing.assert_series_equal(losses(ledger, run_id), losses(ledger, twin),
                                   check_exact=True)


def stopped_for(seconds: float, stop: Callable[[], None], go: Callable[[], None]) -> None:
    stop()
    time.sleep(seconds)
    go()


@contextlib.contextmanager
def crash_writer(cluster: Cluster, url: str,
                 spill: Path | None = None) -> Iterator[tuple[Ledger, str, Any]]:
    """On ``url`` (the cluster, or a pooler in front of it), told to flush its log only every
    10 s: a planned run claimed, and its metric writer (``spill``: as a run's process opens
    it); (the ledger riding out outages, the run id, the writer)."""
    cluster.admin("ALTER SYSTEM SET wal_writer_delay = '10s'", "SELECT pg_reload_conf()")
    with Ledger.open(url, create=True) as plain:
        (run_id,) = plan_quick(plain, "crash", runs=1, updates=3)
    with Ledger.open(url, ride_out=True) as ledger:
        claim = ledger.claim_next("crash", "w")
        assert claim is not None
        yield ledger, run_id, ledger.metric_writer(run_id, claim.segment_id, lease=claim.lease,
                                                   spill=spill)


def points_through_a_crash(cluster: Cluster, url: str) -> list[int]:
    """100 points acknowledged, the server crashed at once (`-m immediate`), 50 more; the
    steps the ledger holds afterwards (:func:`crash_writer`)."""
    with crash_writer(cluster, url) as (ledger, run_id, writer):
        for step in range(1, 101):
            writer.log("train/loss", step, 1.0 / step)
        assert writer.flush() == 100  # acknowledged, in the server's memory only
        cluster.ctl("restart", "-m", "immediate")
        for step in range(101, 151):
            writer.log("train/loss", step, 1.0 / step)
        writer.close()
        points = ledger.metrics(runs=[run_id], keys=["train/loss"], all_segments=True)
    return sorted(points["step"])


GAUNTLET_UPDATES = 80  # the run outlasts the four faults (it trains on through each)


def gauntlet(cluster: Cluster, bouncer: Bouncer) -> Callable[[], None]:
    """Every kind of outage, one after another, under one run on ``bouncer.url``, the shorter
    first: the ledger's sessions are killed (`pg_terminate_backend`); at update 10 the
    PgBouncer restarts; at 30 the server restarts (`-m fast`); at 55 it crashes
    (`-m immediate`). (A 30 s stop is the local tests' and the past-the-limit tests'.)"""

    def reached(step: int) -> None:
        wait_for(lambda: _last_step_of(bouncer.url, "blinks") >= step, 120, f"update {step}",
                 every=0.5)

    def disrupt() -> None:
        cluster.admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = 'ledger' AND pid <> pg_backend_pid()")
        reached(10)
        stopped_for(2, bouncer.stop, bouncer.start)
        reached(30)
        cluster.ctl("restart", "-m", "fast")
        reached(55)
        cluster.ctl("restart", "-m", "immediate")

    return disrupt


def _last_step_of(url: str, campaign: str) -> int:
    """The last recorded update of ``campaign``'s only run (-1 while the ledger is away)."""
    with contextlib.suppress(Exception), Ledger.open(url) as ledger:
        (run_id,) = ledger.runs(campaign)["run_id"]
        return last_step(ledger, run_id)
    return -1


def outlived(worker: subprocess.Popen[str], ready: Callable[[], bool], what: str,
             cluster: Cluster, timeout: float = 180) -> str:
    """Once ``ready()``, the server stops for good; ``worker`` (its CAMPAIGN_LEDGER_OUTAGE_S
    short) must give up and exit 3. Its stderr."""
    try:
        wait_for(ready, 120, what)
        cluster.ctl("stop", "-m", "fast")
        _, stderr = worker.communicate(timeout=timeout)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 3, stderr[-3000:]
    return stderr
