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
    """A reshuffle per epoch from (seed, epoch); the position is (epoch, cursor)."""

    def __init__(self, size: int, seed: int, per_update: int, last_batch: str) -> None:
        self.size, self.seed, self.per_update, self.last_batch = size, seed, per_update, last_batch
        self.epoch, self.cursor = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.size, generator=generator).tolist()

    def next_update(self) -> list[int]:
        """The example indices of the next update (a new epoch starts when one is used up)."""
        remaining = self.size - self.cursor
        if remaining == 0 or (self.last_batch == "drop" and remaining < self.per_update):
            self.epoch, self.cursor = self.epoch + 1, 0
            self._order = self._permutation(self.epoch)
        indices = self._order[self.cursor : self.cursor + self.per_update]
        self.cursor += len(indices)
        return indices

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def restore(self, state: Mapping[str, int]) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._permutation(self.epoch)


def to_device(batch: Batch, device: torch.device) -> Batch:
    """Every tensor of a collated batch on ``device``; other values as they are."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


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
