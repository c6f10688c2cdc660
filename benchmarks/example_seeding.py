"""Per-example randomness on the digits task: what seeding costs beside its collate.

    python benchmarks/example_seeding.py [--rounds 200]

One update's reads and collate of 32 digits examples in the training process (no loader
workers), three ways, interleaved round by round, medians:

- ``collate``: the 32 reads and the collate, nothing seeded (the yardstick);
- ``per-example restore`` (before issue 26): each read and the collate seeded, and the
  three generators' states saved and restored around every one of them;
- ``per-update restore`` (now, ``campaign.loop.loader``): each read and the collate seeded
  the same way, the states saved once before the update and restored once after it.

Both seeded ways draw the same values (checked here on a read that draws from all three
generators); the training RNG after the update is the same. Prints the added cost per
batch and its ratio to the collate.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import interleaved
from campaign.loop.loader import PreservedGenerators, example_seed, seed_generators
from campaign.tasks.digits import DigitsTask

SEED, BATCH = 7, 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    task = DigitsTask({"task": {}})
    train = task.splits()["train"]

    def plain() -> object:
        return task.collate([train[i] for i in range(BATCH)])

    def per_example() -> object:
        examples = []
        for position in range(BATCH):
            with PreservedGenerators():
                seed_generators(example_seed(SEED, 0, position))
                examples.append(train[position])
        with PreservedGenerators():
            seed_generators(example_seed(SEED ^ 1, 0, 0))
            return task.collate(examples)

    def per_update() -> object:
        with PreservedGenerators():
            examples = []
            for position in range(BATCH):
                seed_generators(example_seed(SEED, 0, position))
                examples.append(train[position])
            seed_generators(example_seed(SEED ^ 1, 0, 0))
            return task.collate(examples)

    _same_draws()
    times = interleaved({"collate": plain, "per-example restore": per_example,
                         "per-update restore": per_update}, args.rounds)  # fmt: skip
    base = times["collate"]
    print(f"digits, {BATCH} examples an update, {args.rounds} interleaved rounds (medians)")
    print(f"  collate alone:        {base * 1e3:8.3f} ms")
    for name in ("per-example restore", "per-update restore"):
        added = times[name] - base
        print(f"  {name + ':':22}{times[name] * 1e3:8.3f} ms  (+{added * 1e3:.3f} ms, "
              f"{added / base:5.1f}x the collate)")
    print(f"  per-update / per-example seeding cost: "
          f"{(times['per-update restore'] - base) / (times['per-example restore'] - base):.2f}")


def _same_draws() -> None:
    """Both ways give every example the same draws and leave the same training RNG."""

    def draw() -> tuple[float, float, float]:
        return random.random(), float(np.random.normal()), float(torch.rand(1))

    outcomes = []
    for preserve_each in (True, False):
        torch.manual_seed(0)
        random.seed(0)
        np.random.seed(0)
        drawn = []
        with PreservedGenerators():
            for position in range(4):
                if preserve_each:
                    with PreservedGenerators():
                        seed_generators(example_seed(SEED, 0, position))
                        drawn.append(draw())
                else:
                    seed_generators(example_seed(SEED, 0, position))
                    drawn.append(draw())
        outcomes.append((drawn, draw()))
    assert outcomes[0] == outcomes[1], "the two ways drew differently"


if __name__ == "__main__":
    main()
