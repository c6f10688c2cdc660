"""A run's ranks across the nodes of a real Ray cluster (tests/support/ray_cluster.py): a head
that runs nothing (no CPUs, as on a real cluster) and two nodes. Each worker task holds a
placement group of W bundles, rank 0 in bundle 0 and rank 1 a Ray task in bundle 1 on the other
node (``--ray-placement STRICT_SPREAD``). Losing that node ends the run ``interrupted``/
``killed`` at its last checkpoint; once a new node joins, Ray places the bundle there and the
live worker resumes the run, whose series equals the same run's on local ranks."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import psutil
import pytest

from campaign.ledger import Ledger
from tests.conftest import require
from tests.support.engine_helpers import checkpoint_steps, command_line, running_past
from tests.support.launch_helpers import losses, run, wait_for
from tests.support.loop_helpers import plan_quick
from tests.support.ray_cluster import (
    SKIP,
    launch_on_ray,
    node_of,
    node_of_process,
    ray_start,
    started_cluster,
)

pytestmark = pytest.mark.engine

require("ray", "ray")
require("setproctitle", "ray")
SHARDED = {"loop.replicas": 2, "loop.strategy": "fsdp", "loop.accumulation": 1,
           "loop.checkpoint_every": 5}


def _rank_processes(run_id: str) -> list[psutil.Process]:
    """The follower processes of ``run_id`` (rank 1 and up), wherever Ray started them."""
    found = []
    for process in psutil.process_iter():
        words = command_line(process) or []
        if "campaign.launch.follower" in words and run_id in words:
            found.append(process)
    return found


def _lose_node(ip: str) -> None:
    """Kill every process of the node at ``ip`` at once (its raylet, its Ray workers and what
    they started), as a machine that loses power."""
    doomed: list[psutil.Process] = []
    for process in psutil.process_iter():
        words = command_line(process) or []
        if any(word in (f"--node_ip_address={ip}", f"--node-ip-address={ip}") for word in words):
            doomed.append(process)
            with contextlib.suppress(psutil.Error):
                doomed += process.children(recursive=True)
    assert doomed, f"no process of node {ip}"
    for process in doomed:
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGKILL)


@pytest.fixture
def three_nodes() -> Iterator[tuple[str, Path]]:
    with started_cluster(("127.0.0.2", "127.0.0.3"), head_cpus=0) as cluster:
        yield cluster


@pytest.mark.slow
def test_a_runs_ranks_are_a_placement_group_across_nodes_and_a_lost_node_interrupts_it(
    postgresql_url: str, tmp_path: Path, three_nodes: tuple[str, Path]
) -> None:
    address, _ = three_nodes
    with Ledger.open(postgresql_url, create=True) as ledger:
        (reference,) = plan_quick(ledger, "rr-local", runs=1, updates=40,
                                  task={"sleep_s": 0.03}, hold=SHARDED, validation_every=10)
        (run_id,) = plan_quick(ledger, "rr", runs=1, updates=40, task={"sleep_s": 0.03},
                               hold=SHARDED, validation_every=10)
    local = run(postgresql_url, "worker", "rr-local", "--artifacts", str(tmp_path / "l"),
                "--skip-pilot", "--reason", "reference", "--no-replay-check")
    assert local.returncode == 0, local.stderr[-2000:]
    launch = launch_on_ray(postgresql_url, "rr", tmp_path, "--workers", "1",
                           "--ray-placement", "STRICT_SPREAD", "--resume-interrupted",
                           env={"RAY_ADDRESS": address})
    with Ledger.open(postgresql_url) as ledger:
        found: list[tuple[str, str]] = []
        try:  # (19 s here alone; a loaded machine starts three Ray nodes slowly)
            wait_for(lambda: bool(found.extend(running_past(ledger, "rr", 7)) or found)
                     or launch.poll() is not None, 480, "the run past update 7 on two nodes")
        except AssertionError as late:  # what the launcher and the run said: why not
            launch.kill()
            said = launch.communicate()[1][-3000:]
            logs = "".join(p.read_text()[-3000:] for p in (tmp_path / "artifacts").rglob("*.log"))
            raise AssertionError(f"{late}\n{said}\n{logs}") from None
        assert found, launch.communicate()[1][-3000:]
        (rank1,) = _rank_processes(run_id)
        first, second = node_of(found[0][1]), node_of_process(rank1)
        assert {first, second} == {"127.0.0.2", "127.0.0.3"}, (first, second)

        _lose_node(second)
        wait_for(lambda: ledger.run(run_id).status != "running", 120, "the run's end")
        record = ledger.run(run_id)
        assert (record.status, record.stop_cause) == ("interrupted", "killed"), record.stop_detail
        assert "the run's rank 1" in record.stop_detail, record.stop_detail
        kept = max(checkpoint_steps(ledger, "rr", run_id))
        assert f"its last checkpoint is at update {kept}" in record.stop_detail

        ray_start("--address", address, "--node-ip-address", "127.0.0.4")  # a new machine
        _, stderr = launch.communicate(timeout=400)
        assert launch.returncode == 0, stderr[-3000:]
        assert ledger.run(run_id).status == "completed"
        segments = ledger.segments("rr")
        assert len(segments) == 2 and segments["worker"].nunique() == 1  # the live worker
        pd.testing.assert_series_equal(losses(ledger, run_id), losses(ledger, reference),
                                       check_exact=False, rtol=1e-9, atol=0)
        logs = ledger.artifacts("rr").query("kind == 'log'")["path"]
        text = "".join(Path(p).read_text() for p in logs)
        assert text.count(f"run {run_id}: ranks 1..1 as Ray tasks in placement group") == 2
        events = ledger.events("rr")
        assert events["detail"].str.contains("rank 1").any() and "killed" in set(events["kind"])


def test_ranks_no_node_of_the_cluster_can_hold_apart_are_one_error_line(
    postgresql_url: str, tmp_path: Path
) -> None:
    """A private instance is one node: a run's two ranks each on a node of its own can never be
    placed; said before anything is submitted, every run left as it was."""
    with Ledger.open(postgresql_url, create=True) as ledger:
        plan_quick(ledger, "rr-apart", runs=1, hold=SHARDED)
    refused = run(postgresql_url, "launch", "rr-apart", "--executor", "ray", "--workers", "1",
                  "--ray-placement", "strict_spread", "--artifacts", str(tmp_path), *SKIP,
                  timeout=180)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert ("--ray-placement STRICT_SPREAD puts each of a run's 2 ranks on a node of its own, "
            "but the Ray cluster has 1 node(s)") in refused.stderr
    assert "Traceback" not in refused.stderr
    with Ledger.open(postgresql_url) as ledger:
        assert set(ledger.runs("rr-apart")["status"]) == {"planned"}


def test_a_share_of_a_gpu_per_rank_is_refused_before_any_cluster_is_asked(
    postgresql_url: str, tmp_path: Path
) -> None:
    with Ledger.open(postgresql_url, create=True) as ledger:
        plan_quick(ledger, "rr-half", runs=1, hold=SHARDED)
    refused = run(postgresql_url, "launch", "rr-half", "--executor", "ray", "--gpus-per-run",
                  "1", "--artifacts", str(tmp_path), *SKIP, timeout=120)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.strip() == (
        "campaign: --gpus-per-run 1 over a run's 2 ranks gives 0.5 GPU per rank: each rank "
        "needs whole GPUs of its own (NCCL refuses two ranks on one device); use a multiple "
        "of 2")
