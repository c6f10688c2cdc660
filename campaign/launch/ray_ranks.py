"""A run's ranks 1..W-1 as Ray tasks in its worker's placement group:
``python -m campaign.launch.ray_ranks``.

On Ray, each worker task reserves a placement group of W bundles (the
campaign's largest ``loop.replicas``) and runs in bundle 0
(:mod:`campaign.launch.ray_executor`). When a run of W ranks starts, its
rank 0 (the run's process, which holds no Ray connection of its own) starts
this program as it would start ``srun`` on SLURM: it joins the cluster as a
driver, waits for the group's bundles to be placed (after a node loss Ray
places them again once a node has room), says so, and runs rank r as a Ray
task in bundle r, which runs the follower (:mod:`campaign.launch.follower`)
as a child that dies with it.

How the ranks ended is this program's exit code and its verdict file (JSON
lines, read by rank 0): ``placed`` once every bundle is; ``lost`` when a
rank's Ray worker or node is gone, or its process was killed by a signal
nobody of ours sent (the run then ends ``interrupted``/``killed`` and is
resumed, docs/runs.md); ``failed`` when a rank's own code failed (the run's
own error, which rank 0 meets too). On the first rank lost or failed, the
others are cancelled: they would wait in a collective that cannot complete.

The ledger URL reaches the tasks without its password, as the worker tasks'
does (:mod:`campaign.launch.secret_file`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from campaign.host.processes import killed_from_outside, signal_name

GROUP_ENV = "CAMPAIGN_RAY_GROUP"  # the worker task's placement group, as JSON (see placed_at)
LOST_EXIT = 75  # a rank's process, worker or node was lost: not the run's fault
PLACEMENT_WAIT_S = float(os.environ.get("CAMPAIGN_RAY_PLACEMENT_WAIT_S", "240"))
OUTPUT_TAIL = 4000
SETTLE_S = 10.0  # after a rank ends badly, how long the others get to say how they ended


def placed_at(address: str, namespace: str, group: str, bundles: int, gpus: float,
              node: str, url: str, secret: str | None, cwd: str) -> str:
    """The value of ``GROUP_ENV`` a worker task sets for its runs' processes: the cluster, its
    placement group and this node's address (rank 0's, the rendezvous), the ledger URL without
    its password (and the file that holds it), the launch's directory."""
    return json.dumps({"address": address, "namespace": namespace, "group": group,
                       "bundles": bundles, "gpus": gpus, "node": node, "url": url,
                       "secret": secret, "cwd": cwd})


def ray_group() -> dict[str, Any] | None:
    """The placement group this process's worker task holds, if it runs in one."""
    text = os.environ.get(GROUP_ENV)
    return None if not text else dict(json.loads(text))


def run_rank(url: str, secret: str | None, run_id: str, rank: int, world: int, address: str,
             port: int, device: str, artifacts: str, cwd: str) -> dict[str, Any]:
    """The body of one rank's Ray task: the follower as a child that dies with this task's
    process (a lost node takes both), its exit and its output's tail."""
    import ray

    from campaign.launch.placement import enter
    from campaign.launch.secret_file import taken_back
    from campaign.ledger.location import ENV_VAR
    from campaign.loop.replicas import Replica, environment_for

    enter(cwd)
    env = {**os.environ, ENV_VAR: taken_back(url, secret),
           **environment_for(Replica(rank, world), address, port)}
    command = [sys.executable, "-m", "campaign.launch.follower", run_id, "--device", device,
               "--artifacts", artifacts, "--die-with-parent"]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          check=False)
    output = done.stdout.decode(errors="replace")
    return {"code": done.returncode, "node": ray.util.get_node_ip_address(),
            "output": output[-OUTPUT_TAIL:]}


def read_verdict(verdict: Path) -> dict[str, Any]:
    """What the program has said so far (later lines override earlier ones)."""
    said: dict[str, Any] = {}
    try:
        for line in verdict.read_text().splitlines():
            said.update(json.loads(line))
    except (OSError, ValueError):
        pass
    return said


def main(argv: list[str] | None = None) -> int:
    """Place and follow ranks 1..W-1 of a run; the exit code says how they ended."""
    parser = argparse.ArgumentParser(prog="python -m campaign.launch.ray_ranks")
    parser.add_argument("run_id")
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--address", required=True, help="rank 0's address (rendezvous)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--artifacts", required=True)
    parser.add_argument("--verdict", type=Path, required=True)
    args = parser.parse_args(argv)
    from campaign.host.processes import die_with_parent

    if not die_with_parent():  # rank 0 is gone already: nothing to join
        return 1
    held = ray_group()
    if held is None:
        print(f"campaign: {GROUP_ENV} is not set: not inside a Ray worker task", file=sys.stderr)
        return 1
    import ray
    from ray.util.placement_group import get_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from campaign.launch import ray_ranks as this  # by reference, not as __main__'s copies

    ray.init(address=held["address"], namespace=held["namespace"], log_to_driver=False,
             logging_level="ERROR")
    group = get_placement_group(held["group"])

    def in_bundle(rank: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank)

    if not this.placed(ray, group, in_bundle, args.world):
        lost = (f"placement group {held['group']!r} had bundles without a live node for "
                f"{PLACEMENT_WAIT_S:.0f} s (a node lost and none with room since)")
        _say(args.verdict, lost=lost)
        print(f"campaign: run {args.run_id}: {lost}", file=sys.stderr, flush=True)
        return LOST_EXIT
    _say(args.verdict, placed=True)
    body = ray.remote(this.run_rank)
    ranks = {}
    for rank in range(1, args.world):
        ref = body.options(num_cpus=1, num_gpus=held["gpus"], max_retries=0,
                           scheduling_strategy=in_bundle(rank),
                           name=f"campaign:{args.run_id}:{rank}"
                           ).remote(held["url"], held["secret"], args.run_id, rank, args.world,
                                    args.address, args.port, args.device, args.artifacts,
                                    held["cwd"])
        ranks[ref] = rank
    return _follow(ray, ranks, args.run_id, args.verdict)


def node_address() -> str:
    import ray

    return str(ray.util.get_node_ip_address())


def placed(ray: Any, group: Any, in_bundle: Any, world: int) -> bool:
    """Whether bundles 1..W-1 are on live nodes, found by running a probe in each (retried:
    just after a node loss, Ray may not know yet and still show the group placed there; the
    probe fails once it knows, and runs again where Ray places the bundle next), within
    ``PLACEMENT_WAIT_S``. A rank's own task is never retried: it would join a group that
    went on without it."""
    deadline = time.monotonic() + PLACEMENT_WAIT_S
    probe = ray.remote(node_address)
    while time.monotonic() < deadline:
        if not group.wait(timeout_seconds=max(1.0, deadline - time.monotonic())):
            return False
        probes = [probe.options(num_cpus=1, max_retries=3, scheduling_strategy=in_bundle(r))
                  .remote() for r in range(1, world)]
        try:
            ray.get(probes, timeout=max(1.0, deadline - time.monotonic()))
            return True
        except ray.exceptions.GetTimeoutError:
            return False
        except ray.exceptions.RayError:  # a node lost meanwhile: wait for the group again
            time.sleep(1.0)
    return False


def _follow(ray: Any, ranks: dict[Any, int], run_id: str, verdict: Path) -> int:
    """Wait for the ranks; on the first that ends badly, look at the others a moment longer
    (with three ranks or more, a rank killed breaks its peers' collectives too, and they may
    report first), cancel the rest and say the worst: a rank lost before a rank failed."""
    pending = list(ranks)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        ends = [_ending(ray, ranks[ref], ref) for ref in done]
        if all(kind is None for kind, _ in ends):
            continue
        more, pending = ray.wait(pending, num_returns=len(pending), timeout=SETTLE_S)
        ends += [_ending(ray, ranks[ref], ref) for ref in more]
        for ref in pending:
            ray.cancel(ref, force=True)
        kind, what = next((e for e in ends if e[0] == "lost"), None) or next(
            e for e in ends if e[0] is not None)
        _say(verdict, **{str(kind): what})
        print(f"campaign: {what}", file=sys.stderr, flush=True)
        return LOST_EXIT if kind == "lost" else 1
    print(f"campaign: run {run_id}: its other ranks ended", file=sys.stderr, flush=True)
    return 0


def _ending(ray: Any, rank: int, ref: Any) -> tuple[str | None, str]:
    """How one rank's task ended: (None, "") when well, else ("lost" or "failed", words)."""
    try:
        ended = ray.get(ref)
    except ray.exceptions.RayTaskError as error:  # our own code raised in the task
        return "failed", f"rank {rank}'s Ray task failed: {last_line(error)}"
    except Exception as error:  # its worker or node is gone (NodeDiedError, ...)
        return "lost", (f"rank {rank} was lost with its Ray worker ({type(error).__name__}: "
                        f"{last_line(error)})")
    code = int(ended["code"])
    if code == 0:
        return None, ""
    print(ended["output"], file=sys.stderr, end="", flush=True)  # into the run's log
    if killed_from_outside(code):
        return "lost", f"rank {rank} (on node {ended['node']}) was killed by {signal_name(-code)}"
    return "failed", f"rank {rank} (on node {ended['node']}) exited with status {code}"


def _say(verdict: Path, **what: Any) -> None:
    """One line of the verdict file rank 0 reads (campaign.launch.replicated.Followers)."""
    with verdict.open("a") as handle:
        handle.write(json.dumps(what) + "\n")


def last_line(error: BaseException) -> str:
    """The last line of a Ray error's message: Ray puts the cause there, below its own
    traceback of the remote call."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(error).__name__

if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no teardown of Ray's driver threads: the verdict is written
