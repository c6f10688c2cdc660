"""The Ray executor on a private local Ray instance with a PostgreSQL ledger."""

from __future__ import annotations

import ipaddress
import os
import signal
from pathlib import Path

import psutil
import pytest

from campaign.ledger import Ledger
from tests.conftest import require
from tests.launch_helpers import event_counts, last_step, run, start, wait_for
from tests.loop_helpers import plan_quick

require("ray", "ray")
SKIP = ("--skip-pilot", "--reason", "ray test")


@pytest.mark.slow
def test_ray_runs_a_campaign_and_a_retried_task_never_runs_a_run_twice(
    postgresql_url: str, tmp_path: Path
) -> None:
    with Ledger.open(postgresql_url, create=True) as ledger:
        run_ids = plan_quick(ledger, "on-ray", runs=6, updates=40, task={"sleep_s": 0.02},
                             hold={"loop.checkpoint_every": 5}, validation_every=3)  # fmt: skip
        launch = start(
            postgresql_url, "launch", "on-ray", "--executor", "ray", "--workers", "2",
            "--artifacts", str(tmp_path / "artifacts"), "--heartbeat-s", "0.5",
            "--lease-s", "5", "--no-replay-check", *SKIP,
        )  # fmt: skip
        victim: list[str] = []

        def a_run_past_update_7() -> bool:
            running = ledger.runs("on-ray", status="running")
            for row in running.itertuples():
                if last_step(ledger, row.run_id) >= 7:
                    victim[:] = [row.run_id, row.worker]
                    return True
            return False

        wait_for(a_run_past_update_7, 180, "a Ray task in the middle of its run")
        _assert_private_instance_is_loopback_with_a_token(launch.pid)
        run_id, worker = victim
        os.kill(int(worker.split(":")[1]), signal.SIGKILL)  # the Ray worker process of the task
        _, stderr = launch.communicate(timeout=300)
        assert launch.returncode == 0, stderr[-3000:]

        runs = ledger.runs("on-ray").set_index("run_id")
        assert sorted(runs.index) == sorted(run_ids)
        assert set(runs["status"]) == {"completed"}
        counts = event_counts(ledger, "on-ray")
        assert (counts["completed"] == 1).all() and (counts["running"] == 1).all()
        # The killed task's retry found the dead lease, waited for the run to be declared
        # lost, and continued it in a second segment: one execution at a time, one result.
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


def _assert_private_instance_is_loopback_with_a_token(launcher_pid: int) -> None:
    """The Ray servers the launcher started listen on 127.0.0.1 only, with token auth on."""
    commands = {p: _command_line(p) for p in psutil.Process(launcher_pid).children(recursive=True)}
    servers = [
        p for p, words in commands.items()
        if any(name in " ".join(words) for name in ("gcs_server", "raylet"))
    ]  # fmt: skip
    assert {Path(commands[p][0]).name for p in servers} >= {"gcs_server", "raylet"}
    listening = [
        c.laddr.ip for p in servers for c in p.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]  # fmt: skip
    assert listening and all(_loopback(ip) for ip in listening), listening
    for server in servers:
        environment = server.environ()
        assert environment.get("RAY_AUTH_MODE") == "token"
        assert len(environment.get("RAY_AUTH_TOKEN", "")) == 64


def _command_line(process: psutil.Process) -> list[str]:
    """A child's argv, or nothing for one that ended (a zombie) while the tree was listed."""
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _loopback(text: str) -> bool:
    """127.0.0.1, ::1 or 127.0.0.1 seen through an IPv6 socket (::ffff:127.0.0.1)."""
    address = ipaddress.ip_address(text)
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def test_ray_gpu_request_on_a_cpu_only_cluster_fails_fast(
    postgresql_url: str, tmp_path: Path
) -> None:
    with Ledger.open(postgresql_url, create=True) as ledger:
        plan_quick(ledger, "no-gpu", runs=2)
    refused = run(
        postgresql_url, "launch", "no-gpu", "--executor", "ray", "--workers", "1",
        "--gpus-per-run", "1", "--artifacts", str(tmp_path), *SKIP, timeout=180,
    )  # fmt: skip
    # Bounded: run() raises after 180 s, so a launcher waiting for a GPU forever fails here.
    assert refused.returncode == 2
    assert "asks for 1 GPU(s) but the Ray cluster has 0" in refused.stderr
    assert "Traceback" not in refused.stderr
    with Ledger.open(postgresql_url, create=True) as ledger:
        assert set(ledger.runs("no-gpu")["status"]) == {"planned"}
