"""A regression task on campaign.Task's defaults: y = 3 x0 - 2 x1 + 0.5, a linear model.

The overfit gate's default for a regression (R², its direction taken from the score) passes
on it; ``task.learnable = false`` draws every target independently of its inputs, which a
line cannot fit, so the same gate fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

import campaign


class Line(campaign.Task):
    kind, target = "regression", "y"

    def model(self) -> torch.nn.Module:
        return torch.nn.Linear(2, 1)

    def splits(self) -> dict[str, Sequence[dict[str, Any]]]:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(96, 2)).astype(np.float32)
        y = 3 * x[:, 0] - 2 * x[:, 1] + 0.5
        if not self.options.get("learnable", True):
            y = rng.normal(size=96) * 3
        rows = [{"id": f"p{i}", "x": x[i], "y": float(y[i])} for i in range(96)]
        return {"train": rows[:64], "val": rows[64:]}

    def collate(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """``task.collate_scale``: the target scaled at collate (standardised there, say),
        which no check of the raw examples sees."""
        batch = super().collate(examples)
        batch["y"] = batch["y"] * float(self.options.get("collate_scale", 1.0))
        return batch

    def loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
        predicted = self.outputs(model, batch).reshape(-1)
        target = batch["y"].to(predicted.dtype)
        return torch.nn.functional.mse_loss(predicted, target, reduction="sum"), len(target)


def build(config: dict[str, Any]) -> Line:
    return Line(config)
