"""Start a replicated or sharded run: this worker is rank 0; ranks 1..W-1 are follower processes.

The worker that claimed the run keeps the claim, the lease and the
heartbeat, and is the only process that writes. Followers get the ledger
URL through the environment (never on a command line, where ``ps`` would
show a password), join the process group, and train their share of every
update. If the leader fails, the group's timeout ends the followers; if a
follower dies, the leader's next collective fails and the run ends
``failed`` with the error.

Where the followers run: on this machine (a free loopback port), or, inside a
SLURM allocation of at least W tasks (an array task of a campaign with replicated
runs asks for that many), as one step of W - 1 tasks on whichever nodes SLURM
gave the allocation, the rendezvous at this node's name. A step's ranks learn
theirs from ``SLURM_PROCID`` and take the scheduler's preemption signal as rank 0
does, so a preemption of any rank checkpoints the whole run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from campaign.ledger import Ledger
from campaign.ledger.location import ENV_VAR
from campaign.loop import replicas as dp
from campaign.stack.devices import SLURM_TASKS

ADDRESS = "127.0.0.1"
RANK_OFFSET = "CAMPAIGN_RANK_OFFSET"  # a SLURM step's rank = its SLURM_PROCID + this
FOLLOWER_EXIT_WAIT_S = 120.0


def slurm_tasks() -> int:
    """The tasks of the SLURM allocation this process runs in (0 outside one)."""
    if "SLURM_JOB_ID" not in os.environ or shutil.which("srun") is None:
        return 0
    return int(os.environ.get(SLURM_TASKS) or 0)


@contextlib.contextmanager
def replica_group(
    ledger: Ledger, run_id: str, world: int, device: str, artifacts: Path
) -> Iterator[dp.Replica]:
    """Start the followers, join the group as rank 0, and reap the followers afterwards."""
    url = ledger.engine.url.render_as_string(hide_password=False)
    on_slurm = world > 1 and slurm_tasks() >= world
    address = socket.gethostname() if on_slurm else ADDRESS
    port = dp.free_port()
    followers = []
    if on_slurm:
        env = {**os.environ, ENV_VAR: url, **dp.environment_for(dp.Replica(1, world), address,
                                                                port), RANK_OFFSET: "1"}
        env.pop("RANK")  # each task's is its SLURM_PROCID + 1
        command = ["srun", f"--ntasks={world - 1}", "--exact", "--unbuffered",
                   "--kill-on-bad-exit=1",
                   "--export=ALL", sys.executable, "-m", "campaign.launch.follower", run_id,
                   "--device", device, "--artifacts", str(artifacts), "--slurm"]
        followers.append(subprocess.Popen(command, env=env))
        print(f"campaign: run {run_id}: ranks 1..{world - 1} as a SLURM step of job "
              f"{os.environ.get('SLURM_JOB_ID')}, rendezvous at {address}:{port}", flush=True)
    else:
        for rank in range(1, world):
            replica = dp.Replica(rank, world)
            env = {**os.environ, ENV_VAR: url, **dp.environment_for(replica, ADDRESS, port)}
            command = [
                sys.executable, "-m", "campaign.launch.follower", run_id,
                "--device", dp.device_for(device, rank), "--artifacts", str(artifacts),
            ]
            followers.append(subprocess.Popen(command, env=env))
    leader = dp.Replica(0, world)
    try:
        with dp.process_group(leader, address, port, torch.device(device)):
            yield leader
    finally:
        for follower in followers:
            try:
                follower.wait(timeout=FOLLOWER_EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                follower.kill()
                follower.wait()
