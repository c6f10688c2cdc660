"""The data gate's check of a task's word that its reads and collates draw nothing.

A task that declares ``random_examples = False`` is read without seeding (the loader's
per-example seeding costs 25 times the digits task's collate). If its reads or collate do
draw from Python's, NumPy's or torch's global generators, its batches would differ between
loader workers and across a resume, and in the training process the draws would shift the
training RNG (dropout masks). So the gate reads and collates the first training examples
under two different seeds of all three generators: the batches must be identical.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from campaign.loop.loader import PreservedGenerators, draws_randomness, seed_generators
from campaign.loop.task import TaskContract
from campaign.pilot.findings import Finding

READS = 32  # the first training examples read twice (one or more microbatches of them)


def declared_randomness(task: TaskContract, train: Any = None) -> Finding:
    """``random_examples_declared``: ok when the task is seeded (it may draw) or its two reads
    under different seeds collate to identical batches (``train``: the training split, when
    the caller has it)."""
    if draws_randomness(task):
        return Finding("random_examples_declared", True, "reads and collates are seeded "
                       "from each example's place (the task may draw)")
    train = task.splits()["train"] if train is None else train
    count = min(READS, len(train))
    first, second = (_read(task, train, count, seed) for seed in (1, 2))
    different = _first_difference(first, second)
    if different is None:
        return Finding("random_examples_declared", True, f"{count} training examples read and "
                       "collated under two seeds: identical (random_examples = False holds)")
    return Finding(
        "random_examples_declared", False,
        f"the task declares random_examples = False, but {count} training examples read and "
        f"collated under two seeds differ in {different!r}",
        "remove random_examples = False (the loader then seeds every read and collate from "
        "the example's place), or stop drawing from the global generators",
    )


def _read(task: TaskContract, train: Any, count: int, seed: int) -> Mapping[str, Any]:
    with PreservedGenerators():  # the caller's generators are left as they were
        seed_generators(seed)
        return task.collate([train[i] for i in range(count)])


def _first_difference(first: Mapping[str, Any], second: Mapping[str, Any]) -> str | None:
    for key in first:
        a, b = first[key], second.get(key)
        if isinstance(a, torch.Tensor):
            same = isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
        else:
            same = a == b
        if not same:
            return str(key)
    return None


def own_order(task: TaskContract, config: Mapping[str, Any], train: Any) -> list[Finding]:
    """``training_order``, with ``loop.sampling = "task"`` only: the task's first updates
    drawn twice under two seeds of the global generators are the same valid updates
    (:func:`campaign.loop.task_order.order_problem`)."""
    loop = config.get("loop") or {}
    if loop.get("sampling") != "task":
        return []
    from campaign.loop.task_order import CHECKED_UPDATES, order_problem

    per_update = (int(loop.get("microbatch", 1)) * int(loop.get("accumulation", 1))
                  * int(loop.get("replicas", 1)))
    problem = order_problem(task, len(train), int(config.get("seed", 0)), per_update)
    if problem is None:
        return [Finding("training_order", True, f"the task's first {CHECKED_UPDATES} updates "
                        "drawn twice from the run's seed: the same, each within the split "
                        "and the effective batch")]
    return [Finding("training_order", False, problem,
                    "draw each update's indices from the seed training_order() is given "
                    "(docs/tasks.md, 'A task's own order')")]
