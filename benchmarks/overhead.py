"""Loop overhead: our loop with full ledger recording against a bare PyTorch loop (and Lightning).

    python benchmarks/overhead.py [--steps 300] [--rounds 3] [--device cuda]

Same model, data, optimizer (AdamW), batch 64 and steps, CPU with 2 threads.
Per-step time is the median step-to-step time in the steady state (after the
first update, which allocates the optimizer state): for our loop from the
wall-time stamps of the logged ``train/loss`` points, for the others with the
same clock at the same point of each step. The median resists this shared
machine's hiccups; costs paid on only a few steps (a metric flush every 250
steps, phase probes every 100) are not in it. glibc's allocator is pinned
(MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) so that the comparison
measures the loops.
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

PINNED = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
if any(os.environ.get(k) != v for k, v in PINNED.items()):
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **PINNED})

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from overhead_task import SyntheticTask, build_model  # noqa: E402

from campaign.ledger import Ledger  # noqa: E402
from campaign.loop.train import execute  # noqa: E402
from campaign.plan.grid import make_plan, record_plan  # noqa: E402
from campaign.plan.spec import resolve_spec  # noqa: E402

BATCH = 64


def bare(model_name: str, steps: int, device: str = "cpu") -> float:
    """Seconds per step of a plain loop: index, forward, loss, backward, step, .item()."""
    task = SyntheticTask({"task": {"model": model_name}})
    torch.manual_seed(0)
    model = build_model(task.shape).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train = task.splits()["train"]
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0)).tolist()
    stamps = []
    for step in range(steps):
        first = (step * BATCH) % len(order)
        batch = task.collate([train[i] for i in order[first : first + BATCH]])  # the same data path
        batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
        loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()
        stamps.append(time.perf_counter())
    return per_step(stamps)


def per_step(stamps: list[float]) -> float:
    """Median step-to-step time after the first update: robust to this machine's hiccups
    (other tenants), while still counting every cost that recurs on most steps."""
    gaps = [b - a for a, b in itertools.pairwise(stamps[1:])]
    return statistics.median(gaps)


def ours(model_name: str, steps: int, folder: Path, index: int, device: str = "cpu") -> float:
    """Seconds per step of RunLoop, from the wall-time stamps of its logged points."""
    spec = {
        "campaign": {
            "name": f"overhead-{model_name}-{index}",
            "question": "overhead",
            "task": "overhead_task:build",
        },
        "hold": {"loop.microbatch": BATCH, "loop.accumulation": 1, "budget.updates": steps},
        "config": {"optimizer.name": "adamw", "optimizer.lr": 1e-3, "task.model": model_name},
        "validation": {"every": 10 * steps, "metric": "val/accuracy", "mode": "max"},
        "stop": {},
        "grid": {"seeds": [0], "control": "only", "variants": [{"name": "only"}]},
    }
    with Ledger.open(f"sqlite:///{folder / 'overhead.db'}", create=True) as ledger:
        record, _ = record_plan(ledger, make_plan(resolve_spec(spec, "overhead")))
        execute(
            ledger,
            record.run_ids[0],
            artifacts=folder / "artifacts",
            replay_in_subprocess=False,
            heartbeat_s=1.0,
            device=device,
        )
        curve = ledger.metrics(record.name, keys=["train/loss"])
    return per_step(curve.sort_values("step")["wall_time"].tolist())


def lightning(model_name: str, steps: int) -> tuple[float, float] | None:
    try:
        import lightning as L
    except ImportError:
        return None
    task = SyntheticTask({"task": {"model": model_name}})
    stamps: dict[bool, list[float]] = {False: [], True: []}

    for log in (False, True):

        class Module(L.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.net = build_model(task.shape)

            def training_step(self, batch: tuple, _index: int, log: bool = log) -> torch.Tensor:
                loss = torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])
                if log:
                    self.log("train/loss", loss)
                stamps[log].append(time.perf_counter())
                return loss

            def configure_optimizers(self) -> torch.optim.Optimizer:
                return torch.optim.AdamW(self.parameters(), lr=1e-3)

        data = torch.utils.data.TensorDataset(task.x, task.y)
        loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True)
        trainer = L.Trainer(
            max_steps=steps,
            accelerator="cpu",
            devices=1,
            logger=log,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tempfile.mkdtemp(),
        )
        torch.manual_seed(0)
        trainer.fit(Module(), loader)
    return per_step(stamps[False]), per_step(stamps[True])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (Lightning: cpu only)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    folder = Path(tempfile.mkdtemp(prefix="campaign-overhead-"))
    print(
        f"torch {torch.__version__} on {args.device}, {torch.get_num_threads()} threads, "
        f"batch {BATCH}, "
        f"{args.steps} steps, allocator pinned: {os.environ.get('MALLOC_MMAP_THRESHOLD_')}"
    )
    for model_name in ("mlp", "tiny"):
        times: dict[str, list[float]] = {"bare": [], "ours": [], "lightning": [], "logged": []}
        for round_index in range(args.rounds):  # interleaved, round by round
            times["bare"].append(bare(model_name, args.steps, args.device))
            times["ours"].append(ours(model_name, args.steps, folder, round_index, args.device))
            result = lightning(model_name, args.steps) if args.device == "cpu" else None
            if result is not None:
                times["lightning"].append(result[0])
                times["logged"].append(result[1])
        medians = {k: statistics.median(v) for k, v in times.items() if v}
        b = medians["bare"]
        print(f"\n{model_name} {SyntheticTask({'task': {'model': model_name}}).shape}")
        labels = {
            "bare": "bare PyTorch loop",
            "ours": "campaign RunLoop + ledger",
            "lightning": "Lightning Trainer",
            "logged": "Lightning + self.log every step",
        }
        for key, label in labels.items():
            if key in medians:
                m = medians[key]
                # The median of per-round ratios pairs measurements taken seconds apart,
                # which cancels most of this machine's slow drifts.
                ratios = [x / y for x, y in zip(times[key], times["bare"], strict=True)]
                print(
                    f"  {label:<34} {m * 1e6:8.0f} us/step  {m / b:5.2f}x bare  "
                    f"(paired {statistics.median(ratios):4.2f}x, +{(m - b) * 1e6:.0f} us/step)"
                )
        if "lightning" not in medians:
            print("  Lightning not installed here (pip install lightning to compare)")
        else:
            share = (medians["ours"] - b) / max(1e-9, medians["lightning"] - b)
            print(f"  our fixed cost per step / Lightning's: {share:.2f}")


if __name__ == "__main__":
    main()
