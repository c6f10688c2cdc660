"""A task's own order of examples (``loop.sampling = "task"``, docs/tasks.md): the example
indices of each update, as the script a task ports draws them (its sampler, its
``torch.randint`` on a generator of its own), so that the port's curve can match the
script's step for step.

The task's ``training_order(seed, per_update)`` returns an iterable of updates, each a
sequence of indices into the training split, from the run's seed alone. The loop walks it
as it walks the built-in orders (:class:`campaign.loop.data.DataOrder`, whose interface this
class has): the position is the number of updates drawn, so a resume draws the order again
from the start and skips to its checkpoint's update. A running digest of every index drawn
is saved with the position: a resume whose order differs from what the run trained on (the
task's code changed between segments) fails with the update where they part, never training
on another order under the same run id. Each ``next()`` runs with the global generators
saved and restored, so an order that draws from them cannot disturb the training RNG; the
pilot's data gate refuses an order that depends on them (:func:`order_problem`).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from campaign.errors import LoopError, OrderEnded
from campaign.loop.loader import PreservedGenerators
from campaign.loop.task import TaskContract

SAMPLING = "task"

CHECKED_UPDATES = 8  # updates the pilot draws twice to hold the order to its seed


class TaskOrder:
    """The task's order at a position: ``epoch`` counts the updates drawn (there are no
    epochs the loop knows of), ``cursor`` is the size of the last one."""

    sampling = SAMPLING

    def __init__(self, task: TaskContract, size: int, seed: int, per_update: int) -> None:
        self.task, self.size, self.seed, self.per_update = task, size, seed, per_update
        self.epoch, self.cursor = 0, 0
        self._digest = hashlib.sha256()
        self._updates = self._start()

    def _start(self) -> Iterator[Sequence[int]]:
        make = getattr(self.task, "training_order", None)
        if not callable(make):
            raise LoopError(missing_order(self.task, [{"loop": {"sampling": SAMPLING}}]))
        try:
            with PreservedGenerators():
                return iter(make(self.seed, self.per_update))
        except Exception as error:  # the user's task code
            raise LoopError(f"training_order() failed: {type(error).__name__}: {error}"
                            ) from error

    def next_update(self) -> list[int]:
        """The example indices of the next update, checked: 1..per_update indices into the
        training split."""
        number = self.epoch + 1
        try:
            with PreservedGenerators():
                drawn = next(self._updates)
        except StopIteration:
            raise OrderEnded(f"training_order() ended after {self.epoch} updates; the run "
                            f"needs update {number} (give updates for the whole budget)"
                            ) from None
        except Exception as error:  # the user's task code
            raise LoopError(f"training_order() failed at update {number}: "
                            f"{type(error).__name__}: {error}") from error
        indices = [int(i) for i in (drawn.tolist() if hasattr(drawn, "tolist") else drawn)]
        if not 1 <= len(indices) <= self.per_update:
            raise LoopError(f"training_order() gave update {number} {len(indices)} examples; "
                            f"an update takes 1 to {self.per_update} (loop.microbatch x "
                            "loop.accumulation x loop.replicas)")
        outside = [i for i in indices if not 0 <= i < self.size]
        if outside:
            raise LoopError(f"training_order() gave update {number} index {outside[0]}, outside "
                            f"the training split's {self.size} examples")
        self._digest.update(np.asarray(indices, dtype=np.int64).tobytes())
        self.epoch, self.cursor = number, len(indices)
        return indices

    def state(self) -> dict[str, Any]:
        """The position a checkpoint saves: updates drawn (no epochs) and their digest."""
        return {"updates": self.epoch, "digest": self._digest.hexdigest()}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Draw the order again from its start up to the checkpoint's update; the digest of
        what was drawn must be the checkpoint's."""
        self._seek(int(state["updates"]))
        saved = state.get("digest")
        if saved is not None and saved != self._digest.hexdigest():
            raise LoopError(f"training_order() gives another order than this run trained on "
                            f"(updates 1..{self.epoch} differ from its checkpoint's): the "
                            "task's order changed since the run started; plan a new campaign")

    def _seek(self, updates: int) -> None:
        self.epoch, self.cursor, self._digest = 0, 0, hashlib.sha256()
        self._updates = self._start()
        for _ in range(updates):
            self.next_update()

    def copy(self) -> TaskOrder:
        """The order at the same position, moving on its own (what a loader walks)."""
        other = TaskOrder.__new__(TaskOrder)
        other.__dict__.update(self.__dict__)
        other._seek(self.epoch)
        return other


def make_order(task: TaskContract, size: int, seed: int, per_update: int,
               loop: Mapping[str, Any]) -> Any:
    """The run's data order: the task's own (``loop.sampling = "task"``) or a built-in one."""
    from campaign.loop.data import DataOrder

    sampling = loop.get("sampling", "epochs")
    if sampling == SAMPLING:
        return TaskOrder(task, size, seed, per_update)
    return DataOrder(size, seed, per_update, loop["last_batch"], sampling)


def order_problem(task: TaskContract, size: int, seed: int, per_update: int) -> str | None:
    """Why the task's order is not one a run can train on, in one line, or None: its first
    updates drawn twice, under two other seeds of the global generators, must be the same
    valid updates (an order drawn from the global generators would differ)."""
    walks = []
    for disturbance in (1, 2):
        with PreservedGenerators():
            random.seed(disturbance)
            np.random.seed(disturbance)
            torch.manual_seed(disturbance)
            try:
                order = TaskOrder(task, size, seed, per_update)
                walk = []
                for _ in range(CHECKED_UPDATES):
                    try:
                        walk.append(order.next_update())
                    except LoopError as error:
                        if "ended after" in str(error) and walk:
                            break
                        raise
            except LoopError as error:
                return str(error)
        walks.append(walk)
    if walks[0] != walks[1]:
        update = next(i for i, (a, b) in enumerate(zip(*walks, strict=False), 1) if a != b)
        return (f"training_order() gave update {update} other examples when drawn again with "
                "the same seed: it must draw from the seed it is given (a torch.Generator of "
                "its own), never from the global generators")
    return None


def missing_order(task: TaskContract, configs: Sequence[Mapping[str, Any]]) -> str | None:
    """At plan: a config asks for the task's order and the task has none (one line)."""
    asked = any((c.get("loop") or {}).get("sampling") == SAMPLING for c in configs)
    if asked and not callable(getattr(task, "training_order", None)):
        return ("loop.sampling = 'task' but the task has no training_order(seed, per_update) "
                "(docs/tasks.md, 'A task's own order')")
    return None
