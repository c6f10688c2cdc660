"""The pilot of a replicated gate class (``loop.replicas`` = W > 1): its W ranks, in their own
process group (gloo on CPU, NCCL on CUDA), as a run has them, under the class's
``loop.strategy`` (a sharded class's ranks each hold their shards: the row per rank is the
memory a sharded rank needs).

The other phases pilot the class in one process: a replicated run's checkpoint, resume and
export happen on rank 0 alone. What only the group shows is checked here, on every rank:

- the same model everywhere: each rank builds the task and the model from the run's seed, and
  after one update (its share of the microbatches, gradients all-reduced) every rank holds the
  same parameters; a task that seeds by rank or reads the process id diverges here;
- one big batch's update: rank 0's parameters after that update match those of one process
  that took the whole effective batch (up to summation order: relative 1e-5);
- each rank's own time and memory: a ``replicas`` row per rank (device ``cpu (rank 1)``), the
  median of a few later updates and that process's RSS peak (or CUDA counters), recorded
  beside the single-process rows.

Ranks 1..W-1 are fresh interpreters (``python -m campaign.pilot.replica_check``) started like a
run's followers; the config reaches them as a JSON file in the pilot's folder, and their
results come back through the group as JSON bytes (nothing is pickled).
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

import torch

from campaign.loop import replicas as dp
from campaign.loop.measure import PhaseRecord, Probe, rss_bytes
from campaign.loop.sharding import full
from campaign.loop.task import build_task
from campaign.loop.trainer import seed_everything
from campaign.pilot.session import PilotSession

ADDRESS = "127.0.0.1"
REPEATS = 3  # later updates timed per rank (the median is the row's duration)
GROUP_TIMEOUT_S = 120.0  # a rank that fails leaves the others waiting at most this long
TOLERANCE = 1e-5  # relative: the group's sums are in another order than one process's
SAME = 1e-12  # relative: the ranks' parameters digested alike


def _session(reference: str, config: dict[str, Any], device: str,
             replica: dp.Replica) -> PilotSession:
    seed_everything(int(config["seed"]))  # as a run's setup does, on every rank
    return PilotSession(build_task(reference, config), config, torch.device(device), replica)


def _parameters(session: PilotSession) -> list[float]:
    """Per trainable parameter: (sum, sum of squares), in float64: a digest to compare."""
    digest: list[float] = []
    for parameter in session.model.parameters():
        if parameter.requires_grad:  # a sharded run's parameter whole (every rank gathers)
            values = full(parameter.detach()).to("cpu", torch.float64)
            digest += [float(values.sum()), float((values * values).sum())]
    return digest


def _first_update(session: PilotSession) -> tuple[int, list[float]]:
    """The first update, as ``session.update()`` takes it; its examples and, before the
    optimizer step, each trainable parameter's gradient norm (float64, whole): what one big
    batch's update is compared by. (Parameters after an AdamW step are not: its first step
    is about ``lr`` times the gradient's sign, which rounding flips where a gradient is 0.)"""
    count, batches, _ = session.next_update()
    session.forward_backward(batches)
    norms = [float(full(p.grad.detach()).to("cpu", torch.float64).norm())
             if p.grad is not None else 0.0  # one process leaves an unused one's None
             for p in session.model.parameters() if p.requires_grad]
    session.step_optimizer()
    return count, norms


def tensor_peak(session: PilotSession) -> dict[str, int]:
    """One more update under PyTorch's own memory tracker (``FSDPMemTracker`` for a sharded
    model, ``MemTracker`` otherwise): the peak bytes of live tensors on this rank's device, by
    kind (parameters, gradients, optimizer state, activations, temporaries). On the CPU, where
    no allocator counts, this is what a projection is checked against (the RSS holds the
    interpreter, the libraries and allocator caches too)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = (FSDPMemTracker(session.model, session.optimizer) if session.sharding is not None
               else MemTracker())
    if session.sharding is None:
        tracker.track_external(session.model, session.optimizer)
    with tracker:
        session.update()
    peak = tracker.get_tracker_snapshot("peak")
    mine = peak.get(session.device) or next(iter(peak.values()), {})
    return {str(kind): int(value) for kind, value in mine.items()}


def held_state(session: PilotSession) -> dict[str, int]:
    """The bytes of parameters, gradients and optimizer state this rank holds (a sharded
    rank's local shards): what `campaign size` projects per device, measured."""
    def local(tensor: Any) -> int:
        held = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        return int(held.numel() * held.element_size())

    parameters = list(session.model.parameters())
    return {"weights_bytes": sum(local(p) for p in parameters),
            "gradient_bytes": sum(local(p.grad) for p in parameters if p.grad is not None),
            "optimizer_bytes": sum(local(v) for state in session.optimizer.state.values()
                                   for v in state.values()
                                   if isinstance(v, torch.Tensor) and v.dim() >= 1)}


def single_process_digest(reference: str, config: dict[str, Any], device: str) -> list[float]:
    """The gradient norms of the first update taken by one process (the whole effective
    batch)."""
    session = _session(reference, config, device, dp.Replica(0, 1))
    try:
        return _first_update(session)[1]
    finally:
        session.close()


def rank_measure(reference: str, config: dict[str, Any], device: str,
                 replica: dp.Replica) -> dict[str, Any]:
    """On one rank, in the group: the first update (its digest), then ``REPEATS`` updates timed
    and measured as this rank's ``replicas`` row."""
    before = rss_bytes()[0]  # what this process held before its model: the peak is beyond it
    session = _session(reference, config, device, replica)
    probe = Probe(torch.device(device))
    try:
        examples, gradients = _first_update(session)
        digest = _parameters(session)
        inputs = {"world": replica.world, "rank": replica.rank, "pid": os.getpid(),
                  "examples_per_update": examples, "share": examples // replica.world,
                  "strategy": config["loop"].get("strategy", "replicate"),
                  "rss_before": before, "state_bytes": held_state(session)}
        with probe.phase("replicas", inputs) as record:
            assert record is not None
            probe.timed(record, session.update, REPEATS)
            record.inputs["tensor_peak"] = tensor_peak(session)
    finally:
        session.close()
    return {"rank": replica.rank, "digest": digest, "gradients": gradients,
            "record": probe.drain()[0].row()}


def check_replicas(reference: str, config: dict[str, Any], device: str,
                   folder: Path) -> list[PhaseRecord]:
    """Rank 0's side: start the followers, measure in the group, compare; one record per rank
    (every rank's verdict is the group's)."""
    world = int(config["loop"]["replicas"])
    reference_digest = single_process_digest(reference, config, device)
    document = folder / "replica-config.json"
    document.write_text(json.dumps(config))
    port = dp.free_port()
    followers = [subprocess.Popen(
        [sys.executable, "-m", "campaign.pilot.replica_check", reference, str(document),
         dp.device_for(device, rank)],
        env={**os.environ, **dp.environment_for(dp.Replica(rank, world), ADDRESS, port)},
    ) for rank in range(1, world)]
    leader = dp.Replica(0, world)
    try:
        with dp.process_group(leader, ADDRESS, port, torch.device(device), GROUP_TIMEOUT_S):
            mine = rank_measure(reference, config, device, leader)
            results = dp.gather_json(mine, leader, torch.device(device)) or [mine]
    finally:
        _reap(followers)
    verdict, detail = _verdict(results, reference_digest, world)
    records = []
    for result in results:
        fields = result["record"]
        rank = result["rank"]
        fields["device"] = f"{dp.device_for(device, rank)} (rank {rank})"
        fields["verdict"], fields["detail"] = verdict, detail
        records.append(PhaseRecord(**fields))
    return records


def _verdict(results: list[dict[str, Any]], single: list[float], world: int) -> tuple[str, str]:
    leader = results[0]["digest"]
    # the same parameters bit for bit; their float64 sums may still differ in the last bit
    # where the summed tensors lie at other alignments (a sharded run's, gathered)
    apart = [r["rank"] for r in results[1:] if any(
        abs(a - b) > SAME * max(abs(b), 1e-300) for a, b in zip(r["digest"], leader, strict=True))]
    if apart:
        return "fail", (f"after one update the parameters differ across ranks (rank 0 against "
                        f"{', '.join(map(str, apart))}): every rank must build the same model "
                        "from the run's seed (a task that seeds by rank or process id does not)")
    norms = results[0]["gradients"]
    worst = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(norms, single, strict=False)),
                default=0.0)
    if worst > TOLERANCE or len(norms) != len(single):
        return "fail", (f"the replicated update is not one big batch's: gradients apart from "
                        f"one process's by up to {worst:.2g} (relative) in the first update")
    times = ", ".join(f"{r['record']['duration_s']:.4g} s" for r in results)
    return "pass", (f"{world} ranks in a process group: the same parameters on every rank after "
                    f"an update, one big batch's (relative difference to one process "
                    f"{worst:.1g}); median update per rank {times}")


def _reap(followers: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + GROUP_TIMEOUT_S
    for follower in followers:
        try:
            follower.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            follower.kill()
            follower.wait()


def main(argv: list[str] | None = None) -> int:
    """A follower rank: ``python -m campaign.pilot.replica_check TASK CONFIG.json DEVICE``."""
    parser = argparse.ArgumentParser(prog="python -m campaign.pilot.replica_check")
    parser.add_argument("reference")
    parser.add_argument("config", type=Path)
    parser.add_argument("device")
    args = parser.parse_args(argv)
    replica = dp.Replica(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    config = json.loads(args.config.read_text())
    device = torch.device(args.device)
    with dp.process_group(replica, address, port, device, GROUP_TIMEOUT_S):
        mine = rank_measure(args.reference, config, args.device, replica)
        dp.gather_json(mine, replica, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
