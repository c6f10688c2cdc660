"""A sharded run (``loop.strategy = "fsdp"``) against a bare FSDP2 script doing the same updates,
and against ``replicate``, at W = 2 and 4 ranks (gloo on CPU, NCCL on CUDA), interleaved round
by round.

- campaign fsdp / replicate: ``campaign worker`` on a fresh SQLite ledger runs the arithmetic
  task's Transformer (its blocks the shard units), every update recorded; the time per update
  is the median of the run's own ``train/update_s`` after the first 3 updates.
- bare FSDP2: W processes of this file (``--bare``) with the same model, shard units, AdamW
  and microbatches, nothing recorded: each rank times its updates, the median after the first
  3 is taken.
- per-rank state: the bytes of a sharded checkpoint's rank file (its parameters and optimizer
  state) over the replicated run's whole checkpoint.

Usage: python benchmarks/sharded.py --updates 40 --rounds 2 [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TASK = {"task.train_size": 2000, "task.val_size": 16, "task.width": 192, "task.layers": 4,
        "optimizer.name": "adamw", "optimizer.lr": 1e-3}
MICROBATCH, WARMUP = 16, 3


def campaign_run(strategy: str, world: int, updates: int, device: str,
                 folder: Path) -> tuple[float, dict[str, int]]:
    """(median seconds per update, checkpoint bytes by file) of one campaign run."""
    from campaign.ledger import Ledger
    from tests.support.loop_helpers import plan_loop

    url = f"sqlite:///{folder / 'ledger.db'}"
    name = f"{strategy}-{world}"
    with Ledger.open(url, create=True) as ledger:
        plan_loop(ledger, name, task="campaign.tasks.arithmetic:build", config=TASK,
                  hold={"loop.microbatch": MICROBATCH, "loop.accumulation": 1,
                        "loop.replicas": world, "loop.strategy": strategy,
                        "budget.updates": updates, "loop.checkpoint_every": updates},
                  validation={"every": updates, "metric": "val/accuracy", "sample": 8})
    command = [sys.executable, "-m", "campaign", "--ledger", url, "worker", name,
               "--artifacts", str(folder / "a"), "--skip-pilot", "--reason", "benchmark",
               "--no-replay-check", "--device", device, "--threads", "1"]
    subprocess.run(command, check=True, capture_output=True, env={**os.environ,
                                                                   "OMP_NUM_THREADS": "1"})
    with Ledger.open(url) as ledger:
        points = ledger.metrics(name, keys=["train/update_s"]).sort_values("step")
        files = ledger.artifacts(name).query("kind == 'checkpoint'")["path"]
    seconds = statistics.median(points["value"].tolist()[WARMUP:])
    newest = Path(files.iloc[-1])
    sizes = {p.name: p.stat().st_size for p in newest.parent.glob(newest.stem + "*")}
    return seconds, sizes


def bare_run(world: int, updates: int, device: str, folder: Path) -> float:
    """Median seconds per update over the ranks of the bare FSDP2 script."""
    from campaign.loop import replicas as dp

    port = dp.free_port()
    ranks = [subprocess.Popen(
        [sys.executable, __file__, "--bare", str(updates), device, str(folder)],
        env={**os.environ, **dp.environment_for(dp.Replica(r, world), "127.0.0.1", port),
             "OMP_NUM_THREADS": "1"}) for r in range(world)]
    assert [r.wait(timeout=600) for r in ranks] == [0] * world
    times = [json.loads((folder / f"bare-{r}.json").read_text()) for r in range(world)]
    return statistics.median(max(per_rank) for per_rank in zip(*times, strict=True))


def bare_rank(updates: int, device_name: str, folder: Path) -> None:
    """One rank of the bare script: fully_shard over the blocks and the root, AdamW, loss sums
    over each update's microbatch divided by its units, no recording."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from campaign.tasks.arithmetic import ArithmeticTask

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device(device_name if device_name == "cpu" else f"cuda:{rank}")
    dist.init_process_group("gloo" if device.type == "cpu" else "nccl")
    task = ArithmeticTask({"task": {k.removeprefix("task."): v for k, v in TASK.items()
                                    if k.startswith("task.")}, "loop": {}})
    torch.manual_seed(0)
    model = task.model().to(device)
    mesh = init_device_mesh(device.type, (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train = task.splits()["train"]
    seconds = []
    for update in range(updates):
        started = time.perf_counter()
        first = (update * world + rank) * MICROBATCH % (len(train) - MICROBATCH)
        batch = task.collate(train[first : first + MICROBATCH])
        batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
        optimizer.zero_grad(set_to_none=True)
        loss_sum, units = task.loss(model, batch)
        (loss_sum / units).backward()
        optimizer.step()
        float(loss_sum.detach())  # the loop reads its loss back once per update too
        seconds.append(time.perf_counter() - started)
    (folder / f"bare-{rank}.json").write_text(json.dumps(seconds[WARMUP:]))
    dist.destroy_process_group()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--bare":
        bare_rank(int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    results: dict[tuple[str, int], list[float]] = {}
    state: dict[int, tuple[int, int]] = {}
    for _ in range(args.rounds):
        for world in args.ranks:
            with tempfile.TemporaryDirectory() as scratch:
                folder = Path(scratch)
                for approach in ("bare", "fsdp", "replicate"):
                    place = folder / approach
                    place.mkdir()
                    if approach == "bare":
                        seconds = bare_run(world, args.updates, args.device, place)
                    else:
                        seconds, sizes = campaign_run(approach, world, args.updates,
                                                      args.device, place)
                        rank_files = [v for k, v in sizes.items() if ".rank-" in k]
                        whole = sum(sizes.values())
                        if approach == "fsdp":
                            state[world] = (max(rank_files, default=whole), 0)
                        else:
                            state[world] = (state[world][0], whole)
                    results.setdefault((approach, world), []).append(seconds)
    print(f"{'approach':<22}{'W':>3}{'s/update':>12}{'vs bare':>10}")
    for world in args.ranks:
        bare = statistics.median(results[("bare", world)])
        for approach in ("bare", "fsdp", "replicate"):
            median = statistics.median(results[(approach, world)])
            print(f"{approach:<22}{world:>3}{median:>12.5f}{median / bare:>10.2f}")
        sharded, whole = state[world]
        print(f"  per-rank checkpoint state, fsdp / replicate: {sharded:,} / {whole:,} bytes = "
              f"{sharded / whole:.3f} (1/W = {1 / world:.3f})")


if __name__ == "__main__":
    main()
