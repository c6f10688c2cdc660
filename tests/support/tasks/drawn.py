"""A task whose ``splits()`` draws from torch's global generator (as a library it calls might)
while its data come from a generator of its own, the same every time (the task contract): the
model's initial weights, drawn after it, depend on that draw having happened."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import campaign


class Drawn(campaign.Task):
    classes = ("negative", "positive")

    def model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    def splits(self) -> dict[str, list[dict[str, Any]]]:
        torch.rand(5)  # a draw from the global generator that the data do not depend on
        x = torch.randn(96, 4, generator=torch.Generator().manual_seed(7))
        labels = (x.sum(dim=1) > 0).long()
        rows = [{"id": f"d{i}", "group": f"d{i}", "x": x[i].numpy(), "label": int(labels[i])}
                for i in range(96)]
        return {"train": rows[:80], "val": rows[80:]}

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
        logits = self.outputs(model, batch)
        return nn.functional.cross_entropy(logits, batch["label"], reduction="sum"), len(logits)


def build(config: dict[str, Any]) -> Drawn:
    return Drawn(config)
