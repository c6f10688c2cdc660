"""Digits with an order of its own (``loop.sampling = "task"``): each update the indices a
script's sampler would draw, a reversed walk through the split by default. ``task.order``
picks a faulty one: ``global`` draws from torch's global generator (the data gate refuses
it), ``short`` ends after three updates, ``outside`` gives an index past the split, ``big``
gives one index more than an update takes. ``task.fault = "sigterm"`` as in
:func:`tests.support.tasks.interrupt.sigterm_once`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from campaign.tasks.digits import DigitsTask
from tests.support.tasks.interrupt import sigterm_once


class Ordered(DigitsTask):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.options = dict(config.get("task", {}))
        self.order = str(self.options.get("order", "walk"))
        self.calls = 0

    def loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        self.calls += model.training
        sigterm_once(self.options, self.calls, model.training)
        return super().loss(model, batch)

    def training_order(self, seed: int, per_update: int) -> Iterator[list[int]]:
        size = len(self.splits()["train"])
        generator = torch.Generator().manual_seed(seed)
        start = int(torch.randint(size, (1,), generator=generator))  # a seeded start
        update = 0
        while True:
            update += 1
            if self.order == "global":
                yield torch.randint(size, (per_update,)).tolist()
            elif self.order == "short" and update > 3:
                return
            elif self.order == "outside" and update == 2:
                yield [0, size]
            elif self.order == "big":
                yield list(range(per_update + 1))
            else:  # backwards through the split
                yield [(start - (update - 1) * per_update - i) % size for i in range(per_update)]


def build(config: dict[str, Any]) -> Ordered:
    return Ordered(config)
