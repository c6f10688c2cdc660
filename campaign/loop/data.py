"""What reaches the model: the run's data order, device transfer, and a description of inputs.

The order is a reshuffle per epoch drawn from (seed, epoch), so the examples of
every update are a function of the run's seed and its position alone: a
resumed run continues the same order from the (epoch, cursor) its checkpoint
saved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from campaign.loop.task import Batch


class DataOrder:
    """Which examples each update uses, from the run's seed alone.

    ``epochs`` (the default): a reshuffle per epoch from (seed, epoch), the position is
    (epoch, cursor), every example once per epoch. ``with_replacement``: each update draws
    its examples uniformly at random from (seed, update number), as language-model
    pretraining draws random windows; the position is the number of updates drawn. Either
    way a resumed run continues the same order from the position its checkpoint saved.
    """

    def __init__(self, size: int, seed: int, per_update: int, last_batch: str,
                 sampling: str = "epochs") -> None:
        self.size, self.seed, self.per_update, self.last_batch = size, seed, per_update, last_batch
        self.sampling = sampling
        self.epoch, self.cursor = 0, 0
        self._order = self._permutation(0) if sampling == "epochs" else None

    def _permutation(self, epoch: int) -> torch.Tensor:
        """The epoch's order as an int32 tensor (the same permutation as int64; a split of ten
        million examples costs 40 MB, not the 400 MB of a Python list)."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.size, generator=generator, dtype=torch.int32)

    def next_update(self) -> list[int]:
        """The example indices of the next update (a new epoch starts when one is used up)."""
        if self._order is None:  # with replacement: update ``epoch + 1``'s own draw
            generator = torch.Generator().manual_seed(
                self.seed * 1_000_003 + 500_000_009 * (self.epoch + 1))
            self.epoch, self.cursor = self.epoch + 1, self.per_update
            return torch.randint(self.size, (self.per_update,), generator=generator).tolist()
        remaining = self.size - self.cursor
        if remaining == 0 or (self.last_batch == "drop" and remaining < self.per_update):
            self.epoch, self.cursor = self.epoch + 1, 0
            self._order = self._permutation(self.epoch)
        indices = self._order[self.cursor : self.cursor + self.per_update].tolist()
        self.cursor += len(indices)
        return indices

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def restore(self, state: Mapping[str, int]) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        if self._order is not None:
            self._order = self._permutation(self.epoch)

    def copy(self) -> DataOrder:
        """An order at the same position that moves on its own (what a loader walks). The
        epoch's permutation is shared, not recomputed: each order replaces (never changes)
        its own at an epoch's end, and ten million examples' permutation is 40 MB."""
        other = DataOrder.__new__(DataOrder)
        other.__dict__.update(self.__dict__)
        return other


def to_device(batch: Batch, device: torch.device, blocking: bool = True) -> Batch:
    """Every tensor of a collated batch on ``device``; other values as they are (a copy from
    pinned memory need not block: ``blocking=False``)."""
    return {k: v.to(device, non_blocking=not blocking) if isinstance(v, torch.Tensor) else v
            for k, v in batch.items()}


def describe_inputs(batches: Sequence[Batch], microbatch: int) -> dict[str, Any]:
    """Shapes, longest length and microbatch of what an update works on (for measurements)."""
    shapes = {k: list(v.shape) for k, v in batches[0].items() if isinstance(v, torch.Tensor)}
    longest = max((int(b["lengths"].max()) for b in batches if "lengths" in b), default=None)
    return {
        "microbatch": microbatch,
        "microbatches": len(batches),
        "shapes": shapes,
        "longest": longest,
    }


GATE_SAMPLE = 20_000  # examples a gate reads of a larger split (a seeded random sample)


def rows(dataset: Any, start: int, stop: int) -> list[Any]:
    """``dataset[start:stop]`` of any sized, indexable dataset (a list, a Sequence, a torch
    ``Dataset``), read example by example: nothing else is materialised."""
    return [dataset[i] for i in range(start, min(stop, len(dataset)))]


def gate_view(dataset: Any, limit: int = GATE_SAMPLE, seed: int = 0) -> tuple[list[Any], str]:
    """Every example of a split up to ``limit``; beyond, a seeded random sample of ``limit``
    (in index order), with the words that say so for the gate's output."""
    size = len(dataset)
    if size <= limit:
        return rows(dataset, 0, size), ""
    import numpy as np

    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(size, limit, replace=False))  # exactly `limit` (Floyd's)
    return [dataset[int(i)] for i in chosen], f"a seeded sample of {limit:,} of {size:,} examples"
