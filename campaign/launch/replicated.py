"""Start a replicated run: this worker is rank 0; ranks 1..W-1 are follower processes.

The worker that claimed the run keeps the claim, the lease and the
heartbeat, and is the only process that writes. Followers get the ledger
URL through the environment (never on a command line, where ``ps`` would
show a password), join the process group on a free loopback port, and train
their share of every update. If the leader fails, the group's timeout ends
the followers; if a follower dies, the leader's next collective fails and
the run ends ``failed`` with the error.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from campaign.ledger import Ledger
from campaign.ledger.location import ENV_VAR
from campaign.loop import replicas as dp

ADDRESS = "127.0.0.1"
FOLLOWER_EXIT_WAIT_S = 120.0


@contextlib.contextmanager
def replica_group(
    ledger: Ledger, run_id: str, world: int, device: str, artifacts: Path
) -> Iterator[dp.Replica]:
    """Start the followers, join the group as rank 0, and reap the followers afterwards."""
    port = dp.free_port()
    url = ledger.engine.url.render_as_string(hide_password=False)
    followers = []
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
        with dp.process_group(leader, ADDRESS, port, torch.device(device)):
            yield leader
    finally:
        for follower in followers:
            try:
                follower.wait(timeout=FOLLOWER_EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                follower.kill()
                follower.wait()
