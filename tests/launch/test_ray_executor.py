"""The Ray executor with a PostgreSQL ledger: a private local instance the launcher starts, and
a real two-node cluster on loopback addresses started with `ray start` (head on 127.0.0.1, a
second node on 127.0.0.2), joined through RAY_ADDRESS. Each Ray task is a worker that claims
runs until none is left. The ledger URL carries a password (trust authentication accepts any):
it must reach no file of the launch, no command line and no Ray record."""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from campaign.ledger import Ledger
from tests.conftest import require
from tests.support.engine_helpers import (
    SECRET,
    checkpoint_steps,
    command_line,
    no_secret_in,
    running_past,
    with_password,
)
from tests.support.launch_helpers import event_counts, run, wait_for
from tests.support.loop_helpers import plan_quick
from tests.support.outages import (
    GAUNTLET_UPDATES,
    Bouncer,
    Cluster,
    gauntlet,
    ridden_out,
)
from tests.support.ray_cluster import SKIP, launch_on_ray, node_of, random_ports

pytestmark = pytest.mark.engine

require("ray", "ray")
require("setproctitle", "ray")  # the launcher masks its command line for Ray's jobs API
SLOW = {"task": {"sleep_s": 0.02}, "hold": {"loop.checkpoint_every": 5}, "validation_every": 3}


@pytest.mark.slow
def test_ray_workers_run_a_campaign_and_a_killed_one_is_resumed_never_twice(
    postgresql_url: str, tmp_path: Path
) -> None:
    ray_files = Path(f"/tmp/rt-{secrets.token_hex(4)}")
    try:
        with Ledger.open(postgresql_url, create=True) as ledger:
            run_ids = plan_quick(ledger, "on-ray", runs=6, updates=40, **SLOW)
            launch = launch_on_ray(postgresql_url, "on-ray", tmp_path, "--workers", "2",
                             "--resume-lost", env={"RAY_TMPDIR": str(ray_files)})
            found: list[tuple[str, str]] = []
            wait_for(lambda: bool(found.extend(running_past(ledger, "on-ray", 7)) or found),
                     180, "a Ray worker in the middle of a run")
            _assert_private_instance_is_loopback_with_a_token(launch.pid)
            no_secret_in(tmp_path / "artifacts")
            (held,) = (tmp_path / "secrets").glob("launch-*/ledger.secret")  # meanwhile
            assert held.stat().st_mode & 0o777 == 0o600
            assert held.parent.stat().st_mode & 0o777 == 0o700
            run_id, worker = found[0]
            # at the launcher's niceness, not Ray's 15 for its workers: the launch's own work
            assert psutil.Process(int(worker.split(":")[1])).nice() == os.nice(0)
            os.kill(int(worker.split(":")[1]), signal.SIGKILL)  # the Ray worker process
            _, stderr = launch.communicate(timeout=300)
            assert launch.returncode == 0, stderr[-3000:]

            runs = ledger.runs("on-ray").set_index("run_id")
            assert sorted(runs.index) == sorted(run_ids)
            assert set(runs["status"]) == {"completed"}
            assert runs["worker"].nunique() <= 3  # two worker tasks and one retry, not six jobs
            counts = event_counts(ledger, "on-ray")
            assert (counts["completed"] == 1).all() and (counts["running"] == 1).all()
            # The killed worker's run was declared lost once its lease expired and continued by
            # a live worker in a second segment: one execution at a time, one result.
            assert counts.loc[run_id, "lost"] == 1 and counts.loc[run_id, "resumed"] == 1
            others = counts.drop(index=run_id)
            assert "resumed" not in others or (others["resumed"] == 0).all()
            segments = ledger.segments("on-ray")
            mine = segments[segments["run_id"] == run_id].sort_values("ordinal")
            assert list(mine["ordinal"]) == [1, 2]
            assert mine["ended_at"].iloc[0] <= mine["started_at"].iloc[1]  # never two at once
            assert mine["worker"].iloc[0] != mine["worker"].iloc[1]
            points = ledger.metrics("on-ray", all_segments=True)
            assert not points.duplicated(["segment_id", "key", "step"]).any()
        assert not list((tmp_path / "secrets").iterdir())  # removed when the launch ended
        no_secret_in(tmp_path / "artifacts", ray_files)
    finally:
        shutil.rmtree(ray_files, ignore_errors=True)


def _assert_private_instance_is_loopback_with_a_token(launcher_pid: int) -> None:
    """The Ray servers the launcher started listen on 127.0.0.1 only, with token auth on."""
    commands = {p: command_line(p) for p in psutil.Process(launcher_pid).children(recursive=True)}
    servers = [
        p for p, words in commands.items()
        if any(name in " ".join(words) for name in ("gcs_server", "raylet"))
    ]
    assert {Path(commands[p][0]).name for p in servers} >= {"gcs_server", "raylet"}
    listening = [
        c.laddr.ip for p in servers for c in p.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert listening and all(_loopback(ip) for ip in listening), listening
    for server in servers:
        environment = server.environ()
        assert environment.get("RAY_AUTH_MODE") == "token"
        assert len(environment.get("RAY_AUTH_TOKEN", "")) == 64


def _loopback(text: str) -> bool:
    """127.0.0.1, ::1 or 127.0.0.1 seen through an IPv6 socket (::ffff:127.0.0.1)."""
    address = ipaddress.ip_address(text)
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


# What the cluster's control store recorded of each driver (the command line the jobs API shows).
ENTRYPOINTS = """
import json, sys, ray
import ray._private.state as state
ray.init(address=sys.argv[1], logging_level="ERROR")
print(json.dumps([job.get("Entrypoint", "") for job in state.jobs()]))
"""


@pytest.mark.slow
def test_on_a_two_node_cluster_sigterm_to_the_launcher_checkpoints_every_run(
    postgresql_url: str, tmp_path: Path, ray_cluster: tuple[str, Path]
) -> None:
    address, ray_files = ray_cluster
    with Ledger.open(postgresql_url, create=True) as ledger:
        run_ids = plan_quick(ledger, "ray-stop", runs=4, updates=3000, **SLOW)
        # RAY_ADDRESS, as Ray's own tools read it; the URL with its password on the command
        # line, as a careless user gives it: Ray must record it masked.
        launch = launch_on_ray(postgresql_url, "ray-stop", tmp_path, "--workers", "3", "--format",
                         "json", "--ledger", with_password(postgresql_url),
                         env={"RAY_ADDRESS": address})
        running: list[tuple[str, str]] = []

        def three_running() -> bool:
            running[:] = running_past(ledger, "ray-stop", 4)
            return len(running) == 3

        wait_for(three_running, 240, "three runs past update 4")
        # Runs on both nodes (Ray registers the head under this machine's own address).
        nodes = {node_of(worker) for _, worker in running}
        assert len(nodes) == 2 and "127.0.0.2" in nodes, nodes
        entrypoints = subprocess.run(
            [sys.executable, "-c", ENTRYPOINTS, address], capture_output=True, text=True,
            timeout=120, env={k: v for k, v in os.environ.items() if not k.startswith("RAY_")},
        )
        recorded = json.loads(entrypoints.stdout.strip().splitlines()[-1])
        assert any("launch ray-stop" in e for e in recorded), recorded
        assert not [e for e in recorded if SECRET in e], [e for e in recorded if SECRET in e]
        launch.send_signal(signal.SIGTERM)
        stdout, stderr = launch.communicate(timeout=180)
        assert launch.returncode == 1, stderr[-3000:]  # interrupted runs need attention
        assert "launch interrupted" in stderr
        for crash in ("Traceback", "Aborted", "core dumped", "*** SIG"):
            assert crash not in stderr, stderr[-3000:]
        document = json.loads(stdout)  # one JSON document, nothing of Ray's before it
        assert document["counts"]["interrupted"] == 3 and document["counts"]["running"] == 0
        runs = ledger.runs("ray-stop").set_index("run_id")
        for run_id, _ in running:
            row = runs.loc[run_id]
            assert (row["status"], row["stop_cause"]) == ("interrupted", "interrupted")
            assert row["stop_step"] in checkpoint_steps(ledger, "ray-stop", run_id), run_id
        assert (runs.loc[run_ids, "status"] == "planned").sum() == 1
    no_secret_in(tmp_path / "artifacts", ray_files)


def test_ray_gpu_request_on_a_cpu_only_cluster_fails_fast(
    postgresql_url: str, tmp_path: Path
) -> None:
    with Ledger.open(postgresql_url, create=True) as ledger:
        plan_quick(ledger, "no-gpu", runs=2)
    refused = run(
        postgresql_url, "launch", "no-gpu", "--executor", "ray", "--workers", "1",
        "--gpus-per-run", "1", "--artifacts", str(tmp_path), *SKIP, timeout=180,
    )
    # Bounded: run() raises after 180 s, so a launcher waiting for a GPU forever fails here.
    assert refused.returncode == 2
    assert "asks for 1 GPU(s) but the Ray cluster has 0" in refused.stderr
    assert "Traceback" not in refused.stderr
    with Ledger.open(postgresql_url, create=True) as ledger:
        assert set(ledger.runs("no-gpu")["status"]) == {"planned"}


def test_a_cluster_address_nothing_answers_at_is_one_error_line(
    postgresql_url: str, tmp_path: Path
) -> None:
    with Ledger.open(postgresql_url, create=True) as ledger:
        plan_quick(ledger, "no-cluster", runs=1)
    (closed,) = random_ports(1)
    launch = launch_on_ray(postgresql_url, "no-cluster", tmp_path,
                     env={"RAY_ADDRESS": f"127.0.0.1:{closed}"})
    _, stderr = launch.communicate(timeout=120)
    assert launch.returncode == 2, stderr[-2000:]
    assert f"no Ray cluster answers at 127.0.0.1:{closed}" in stderr
    assert "Traceback" not in stderr
    with Ledger.open(postgresql_url) as ledger:
        assert set(ledger.runs("no-cluster")["status"]) == {"planned"}


@pytest.mark.slow
def test_ray_workers_and_their_launcher_ride_out_every_kind_of_ledger_outage(
    private_cluster: Cluster, private_bouncer: Bouncer, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a Ray worker task training a run and the launcher following it, through a
    PgBouncer: the ledger's sessions are killed, the PgBouncer restarts, the server restarts,
    then crashes (tests/support/outages.py gauntlet). The run ends as its twin, every
    point once; the private Ray instance is not shut down for it (docs/runs.md, faults)."""
    monkeypatch.setenv("CAMPAIGN_SECRETS_DIR", str(tmp_path / "secrets"))
    ridden_out(private_bouncer.url, tmp_path, gauntlet(private_cluster, private_bouncer),
               ("launch", "blinks", "--executor", "ray", "--workers", "1"),
               updates=GAUNTLET_UPDATES)
