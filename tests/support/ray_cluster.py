"""A real two-node Ray cluster on this machine for the Ray executor's tests (``ray start`` on
loopback addresses), and where a Ray worker process runs."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.engine_helpers import command_line, with_password
from tests.support.launch_helpers import ROOT

SKIP = ("--skip-pilot", "--reason", "ray test")


def ray_start(*arguments: str, cpus: int = 2) -> None:
    ports = [str(p) for p in random_ports(4)]
    command = ["ray", "start", "--disable-usage-stats", "--num-cpus", str(cpus),
               "--dashboard-agent-listen-port", ports[0],
               "--dashboard-agent-grpc-port", ports[1], "--metrics-export-port", ports[2],
               "--runtime-env-agent-port", ports[3], *arguments]
    # Ray starts its worker processes at niceness 15 (the raylet's ``worker_niceness``), and
    # a run's processes inherit it. On this shared machine the suite's other tests run at 0
    # and took nearly all the CPU from such a run (CI: a run's ranks not placed in 480 s).
    # A node of a real cluster runs little else; here its workers run at 0, as Ray's own job
    # manager sets for the drivers it starts.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_worker_niceness"] = "0"
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def random_ports(count: int) -> list[int]:
    import socket

    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


@contextlib.contextmanager
def started_cluster(nodes: tuple[str, ...], head_cpus: int = 2) -> Iterator[tuple[str, Path]]:
    """A real Ray cluster on this machine: `ray start --head` on 127.0.0.1 (``head_cpus``) and
    a node at each of ``nodes``, in a folder of its own; stopped by killing the processes of
    that folder (`ray stop` would stop every Ray instance of the machine)."""
    temp = Path(f"/tmp/rc-{secrets.token_hex(4)}")
    (port, client_port) = random_ports(2)
    address = f"127.0.0.1:{port}"
    try:
        ray_start("--head", "--include-dashboard=false", "--node-ip-address", "127.0.0.1",
                  "--port", str(port), "--ray-client-server-port", str(client_port),
                  "--temp-dir", str(temp), cpus=head_cpus)
        for node in nodes:
            ray_start("--address", address, "--node-ip-address", node)
        yield address, temp
    finally:
        mine = [p for p in psutil.process_iter() if mentions(p, str(temp))]
        for process in mine:
            with contextlib.suppress(psutil.Error):
                process.terminate()
        psutil.wait_procs(mine, timeout=15)
        for process in mine:
            with contextlib.suppress(psutil.Error):
                process.kill()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture
def ray_cluster() -> Iterator[tuple[str, Path]]:
    """A two-node cluster: the head on 127.0.0.1 and a second node on 127.0.0.2."""
    with started_cluster(("127.0.0.2",)) as cluster:
        yield cluster


def mentions(process: psutil.Process, text: str) -> bool:
    try:
        return text in " ".join(process.cmdline())
    except psutil.Error:
        return False


def node_of(worker: str) -> str:
    """The node IP of the raylet whose Ray worker process executes a run."""
    return node_of_process(psutil.Process(int(worker.split(":")[1])))


def node_of_process(process: psutil.Process) -> str:
    """The node IP of the raylet above ``process`` (a Ray worker, or what one started)."""
    for parent in process.parents():
        words = command_line(parent)
        if words and Path(words[0]).name == "raylet":
            (flag,) = [w for w in words if w.startswith("--node_ip_address=")]
            return flag.split("=", 1)[1]
    raise AssertionError(f"no raylet above process {process.pid}")


def launch_on_ray(url: str, campaign: str, tmp_path: Path, *extra: str,
            env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`campaign launch --executor ray`, the URL (with its password) in the environment and
    Ray's files in a folder of this test's (short: Ray's socket paths have a length limit)."""
    environment = {**os.environ, "CAMPAIGN_LEDGER": with_password(url), "OMP_NUM_THREADS": "1",
                   "CAMPAIGN_SECRETS_DIR": str(tmp_path / "secrets"), **(env or {})}
    command = [sys.executable, "-m", "campaign", "launch", campaign, "--executor", "ray",
               "--artifacts", str(tmp_path / "artifacts"), "--heartbeat-s", "0.5",
               "--lease-s", "5", "--no-replay-check", *SKIP, *extra]
    return subprocess.Popen(command, cwd=ROOT, env=environment, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
