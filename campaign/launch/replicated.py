"""Start a replicated or sharded run: this worker is rank 0; ranks 1..W-1 are follower processes.

The worker that claimed the run keeps the claim, the lease and the
heartbeat, and is the only process that writes. Followers get the ledger
URL through the environment (never on a command line, where ``ps`` would
show a password), join the process group, and train their share of every
update. If the leader fails, the group's timeout ends the followers. If a
follower fails by itself, the leader's next collective fails and the run ends
``failed`` with the error; if one was lost (killed by a signal nobody of ours
sent, the OOM killer say, or its Ray worker or node gone), the run ends
``interrupted``/``killed`` at its last checkpoint like a run whose own process
was killed, and is resumed (docs/runs.md, faults).

Where the followers run: on this machine (a free loopback port); inside a
SLURM allocation of at least W tasks (an array task of a campaign with replicated
runs asks for that many), as one step of W - 1 tasks on whichever nodes SLURM
gave the allocation, the rendezvous at this node's name (a step's ranks learn
theirs from ``SLURM_PROCID`` and take the scheduler's preemption signal as rank 0
does, so a preemption of any rank checkpoints the whole run); or, in a Ray worker
task that holds a placement group of W bundles, as Ray tasks in bundles 1..W-1
on whichever nodes Ray placed them (:mod:`campaign.launch.ray_ranks`), the
rendezvous at this node's address.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from campaign.host.processes import ended_how, killed_from_outside, signal_name
from campaign.launch.ray_ranks import ray_group, read_verdict
from campaign.ledger import Ledger
from campaign.ledger.location import ENV_VAR
from campaign.loop import progress_page
from campaign.loop import replicas as dp
from campaign.stack.devices import SLURM_TASKS

ADDRESS = "127.0.0.1"
RANK_OFFSET = "CAMPAIGN_RANK_OFFSET"  # a SLURM step's rank = its SLURM_PROCID + this
FOLLOWER_EXIT_WAIT_S = 120.0
# After a failed collective, how long rank 0 looks for a rank lost: a local follower's or a
# SLURM step's end is seen at once; Ray may take half a minute to declare a node dead.
LOST_WAIT_S = 15.0
RAY_LOST_WAIT_S = 120.0
JOIN_TIMEOUT_S = 300.0  # the group's: for the ranks to join, and for any collective


def slurm_tasks() -> int:
    """The tasks of the SLURM allocation this process runs in (0 outside one)."""
    if "SLURM_JOB_ID" not in os.environ or shutil.which("srun") is None:
        return 0
    return int(os.environ.get(SLURM_TASKS) or 0)


class RankLost(RuntimeError):
    """Another rank of a run was lost before the group formed (killed, or its Ray bundle left
    without a node). Not the run's fault: it ends ``interrupted``/``killed``, resumable."""


@dataclass
class Followers:
    """The processes that hold a run's other ranks (each follower, a SLURM step's ``srun``,
    or the Ray ranks' program), and how to tell that one of them was lost."""

    processes: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    verdict: Path | None = None  # the Ray ranks' program's (campaign.launch.ray_ranks)
    srun: bool = False  # a SLURM step: srun exits 128 + N when a task was killed by signal N
    gone: bool = False
    placed_at: float | None = None

    def lost(self, wait_s: float | None = None) -> str | None:
        """After a collective failed on rank 0: how another rank was lost (its process killed
        by a signal nobody of ours sent, its Ray worker or node gone), or None (they live on,
        or one ended by itself: the run's own error, which fails it). Waits up to ``wait_s``
        for one to end: a peer's death reaches rank 0 as a broken connection at once."""
        if wait_s is None:
            wait_s = RAY_LOST_WAIT_S if self.verdict is not None else LOST_WAIT_S
        deadline = time.monotonic() + wait_s
        while True:
            for label, process in self.processes:
                code = process.poll()
                if code is not None and (how := self._how_lost(label, code)):
                    self.gone = True
                    return how
            if all(p.poll() is not None for _, p in self.processes):
                return None
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)

    def _how_lost(self, label: str, code: int) -> str | None:
        said = read_verdict(self.verdict).get("lost") if self.verdict else None
        if said:
            return str(said)
        if self.srun and code > 128 and killed_from_outside(128 - code):
            return f"{label}: a task was killed by {signal_name(code - 128)}"
        if killed_from_outside(code):
            return f"{label} was killed by {signal_name(-code)}"
        return None

    def waiting(self) -> None:
        """Rank 0's look while it waits for the other ranks at the rendezvous: raise when one
        ended first (:class:`RankLost` when it was lost, RuntimeError when it failed by
        itself), or when they were placed ``JOIN_TIMEOUT_S`` ago and have not all come (while
        Ray places their bundles, after a node loss say, there is no deadline)."""
        progress_page.tick("rendezvous")  # waiting, not stalled (the supervisor's watch)
        for label, process in self.processes:
            code = process.poll()
            if code is None:
                continue
            self.gone = True
            how = self._how_lost(label, code)
            if how is not None:
                raise RankLost(how)
            raise RuntimeError(f"{label} {ended_how(code)} before joining the run's group "
                               "(its output: the run's log)")
        if self.verdict is not None and not read_verdict(self.verdict).get("placed"):
            return
        self.placed_at = self.placed_at or time.monotonic()
        if time.monotonic() - self.placed_at > JOIN_TIMEOUT_S:
            self.gone = True
            raise TimeoutError(f"the run's other ranks did not join within {JOIN_TIMEOUT_S:g} s "
                               "of their start")

    def end(self) -> None:
        """Reap them: at once when one was lost (the others wait on a group that cannot
        complete), else after they finish their part of the run's end."""
        for _, process in self.processes:
            try:
                process.wait(timeout=0 if self.gone else FOLLOWER_EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.verdict is not None:
            self.verdict.unlink(missing_ok=True)


@contextlib.contextmanager
def replica_group(
    ledger: Ledger, run_id: str, world: int, device: str, artifacts: Path
) -> Iterator[Followers]:
    """Start the followers, join the group as rank 0, and reap the followers afterwards."""
    url = ledger.engine.url.render_as_string(hide_password=False)
    held = ray_group()
    on_ray = world > 1 and held is not None and int(held["bundles"]) >= world
    on_slurm = not on_ray and world > 1 and slurm_tasks() >= world
    address = (held["node"] if on_ray and held else socket.gethostname() if on_slurm
               else ADDRESS)
    port = dp.free_port()
    followers = Followers()
    if on_ray:
        descriptor, name = tempfile.mkstemp(prefix=f"campaign-ranks-{run_id}-")
        os.close(descriptor)
        followers.verdict = Path(name)
        command = [sys.executable, "-m", "campaign.launch.ray_ranks", run_id, "--world",
                   str(world), "--address", address, "--port", str(port), "--device",
                   "cuda" if device.startswith("cuda") else "cpu", "--artifacts",
                   str(artifacts), "--verdict", name]
        followers.processes.append((f"ranks 1..{world - 1} (Ray)", subprocess.Popen(command)))
        print(f"campaign: run {run_id}: ranks 1..{world - 1} as Ray tasks in placement group "
              f"{held['group']!r}, rendezvous at {address}:{port}", flush=True)
    elif on_slurm:
        env = {**os.environ, ENV_VAR: url, **dp.environment_for(dp.Replica(1, world), address,
                                                                port), RANK_OFFSET: "1"}
        env.pop("RANK")  # each task's is its SLURM_PROCID + 1
        command = ["srun", f"--ntasks={world - 1}", "--exact", "--unbuffered",
                   "--kill-on-bad-exit=1",
                   "--export=ALL", sys.executable, "-m", "campaign.launch.follower", run_id,
                   "--device", device, "--artifacts", str(artifacts), "--slurm"]
        followers.processes.append((f"ranks 1..{world - 1} (SLURM step)",
                                    subprocess.Popen(command, env=env)))
        followers.srun = True
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
            process = subprocess.Popen(command, env=env)
            followers.processes.append((f"rank {rank} (pid {process.pid})", process))
    leader = dp.Replica(0, world)
    try:
        with dp.process_group(leader, address, port, torch.device(device), JOIN_TIMEOUT_S,
                              while_waiting=followers.waiting):
            yield followers
    finally:
        followers.end()
