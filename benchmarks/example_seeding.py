"""Per-example randomness on the digits task: what seeding costs beside its collate.

    python benchmarks/example_seeding.py [--rounds 200]

One update's reads and collate of 32 digits examples in the training process (no loader
workers), four ways, interleaved round by round, medians:

- ``collate``: the 32 reads and the collate, nothing seeded (the yardstick);
- ``per-example restore`` (before issue 26): each read and the collate seeded, and the
  three generators' states saved and restored around every one of them;
- ``per-update restore`` (a task that may draw: ``campaign.loop.loader``'s own classes):
  each read and the collate seeded the same way, the states saved once before the update
  and restored once after it;
- ``declared`` (a task with ``random_examples = False``, as digits now declares: the same
  classes, nothing seeded).

The two seeded ways draw the same values (checked here on a read that draws from all three
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
from campaign.loop.loader import (
    CollateUpdate,
    PreservedGenerators,
    SeededExamples,
    draws_randomness,
    example_seed,
    seed_generators,
)
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

    keys = [(position, 0, position, 0) for position in range(BATCH)]  # one microbatch
    seeded = SeededExamples(train, SEED, True), CollateUpdate(task, SEED, True)
    assert not draws_randomness(task)  # digits declares random_examples = False
    declared_reads = SeededExamples(train, SEED, False), CollateUpdate(task, SEED, False)

    def per_update() -> object:
        with PreservedGenerators():
            return seeded[1]([seeded[0][key] for key in keys])

    def declared() -> object:
        return declared_reads[1]([declared_reads[0][key] for key in keys])

    _same_draws()
    ways = ("per-example restore", "per-update restore", "declared")
    times = interleaved({"collate": plain, "per-example restore": per_example,
                         "per-update restore": per_update, "declared": declared},
                        args.rounds)
    base = times["collate"]
    print(f"digits, {BATCH} examples an update, {args.rounds} interleaved rounds (medians)")
    print(f"  collate alone:        {base * 1e3:8.3f} ms")
    for name in ways:
        added = times[name] - base
        print(f"  {name + ':':22}{times[name] * 1e3:8.3f} ms  ({added * 1e3:+.4f} ms, "
              f"{added / base:+6.1%} of the collate)")
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
