"""Loader workers on an input-bound task: updates per second with 0 and 2 workers, our loop
against a bare PyTorch loop with the same DataLoader settings, and the data-wait share.

    python benchmarks/loader.py [--updates 120] [--rounds 3]

Reading an example costs ~2 ms of CPU (``loader_task.py``); 16 examples an update
(microbatch 8 x accumulation 2), a small MLP, torch threads 1, on this 2-core
machine. Per-update time is the median step-to-step time after the first update
(our loop: the wall-time stamps of its logged ``train/loss`` points; the bare
loop: the same clock at the same point). The data-wait share is the mean of our
loop's ``train/data_wait_s`` over the median update time. Interleaved rounds,
medians.

Goals (issue 16): 2 workers at least 1.6x the updates per second of 0 workers;
our loop within 1.05x of the bare loop with the same workers; the 0-worker run's
data-wait share above 50%, the 2-worker run's lower.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from loader_task import DecodeTask
from torch.utils.data import DataLoader, RandomSampler

from campaign.ledger import Ledger
from campaign.loop.train import execute
from campaign.plan.grid import make_plan, record_plan
from campaign.plan.spec import resolve_spec

MICROBATCH, ACCUMULATION = 8, 2


def _median_gap(stamps: list[float]) -> float:
    return statistics.median(b - a for a, b in itertools.pairwise(stamps[1:]))


def bare(workers: int, updates: int) -> float:
    """A plain loop over a DataLoader with the same settings: seconds per update."""
    task = DecodeTask({})
    torch.manual_seed(0)
    model = task.model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    extra = {"prefetch_factor": 2} if workers else {}
    loader = DataLoader(task.splits()["train"], batch_size=MICROBATCH, num_workers=workers,
                        sampler=RandomSampler(range(4096), generator=torch.Generator()),
                        collate_fn=task.collate, drop_last=True, **extra)
    batches, stamps = iter(loader), []
    for _ in range(updates):
        optimizer.zero_grad(set_to_none=True)
        for _ in range(ACCUMULATION):
            batch = next(batches)
            loss_sum, units = task.loss(model, batch)
            (loss_sum / (units * ACCUMULATION)).backward()
        optimizer.step()
        loss_sum.item()
        stamps.append(time.perf_counter())
    return _median_gap(stamps)


def ours(workers: int, updates: int, folder: Path, index: int) -> tuple[float, float]:
    """Our loop with full ledger recording: (seconds per update, data-wait share)."""
    name = f"loader-{workers}-{index}"
    spec = {
        "campaign": {"name": name, "question": "loader", "task": "loader_task:build"},
        "hold": {"loop.microbatch": MICROBATCH, "loop.accumulation": ACCUMULATION,
                 "budget.updates": updates, "loop.loader_workers": workers},
        "config": {"optimizer.name": "adamw", "optimizer.lr": 1e-3},
        "validation": {"every": 10 * updates, "metric": "val/accuracy", "mode": "max"},
        "stop": {},
        "grid": {"seeds": [0], "control": "only", "variants": [{"name": "only"}]},
    }
    with Ledger.open(f"sqlite:///{folder / 'loader.db'}", create=True) as ledger:
        record, _ = record_plan(ledger, make_plan(resolve_spec(spec, "loader")))
        execute(ledger, record.run_ids[0], artifacts=folder / "artifacts",
                replay_in_subprocess=False, heartbeat_s=1.0)
        points = ledger.metrics(name, keys=["train/loss", "train/data_wait_s"])
    loss = points[points["key"] == "train/loss"].sort_values("step")
    waits = points[points["key"] == "train/data_wait_s"].sort_values("step")["value"].iloc[1:]
    per_update = _median_gap(loss["wall_time"].tolist())
    return per_update, float(statistics.median(waits)) / per_update


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp(prefix="campaign-loader-"))
    times: dict[str, list[float]] = {}
    shares: dict[int, list[float]] = {0: [], 2: []}
    for round_index in range(args.rounds):
        for workers in (0, 2) if round_index % 2 == 0 else (2, 0):
            times.setdefault(f"bare {workers}", []).append(bare(workers, args.updates))
            seconds, share = ours(workers, args.updates, folder, round_index)
            times.setdefault(f"ours {workers}", []).append(seconds)
            shares[workers].append(share)
    median = {name: statistics.median(values) for name, values in times.items()}
    for name, seconds in median.items():
        print(f"  {name:<8} {seconds * 1e3:7.1f} ms per update  {1 / seconds:6.1f} updates/s")
    print(f"  2 workers vs 0 (ours): {median['ours 0'] / median['ours 2']:.2f}x the updates/s; "
          f"bare: {median['bare 0'] / median['bare 2']:.2f}x")
    for workers in (0, 2):
        print(f"  ours / bare with {workers} workers: "
              f"{median[f'ours {workers}'] / median[f'bare {workers}']:.3f}x the time per update; "
              f"data-wait share {statistics.median(shares[workers]):.0%}")


if __name__ == "__main__":
    main()
