"""The quick task logging metrics of its own (campaign.log_metric): a batch's accuracy weighted
by its rows and the rows of each microbatch (under the phase: train/, val/, train_eval/), the
rows of a training microbatch as `train/examples` (kept in training only: validation calls
loss() too), and a validation batch's mean margin as `val/margin` (validation only)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from campaign import log_metric
from tests.support.tasks.quick import QuickTask


class SelfLogging(QuickTask):
    metrics = ("accuracy",)  # its score() names: plan checks validation.metric
    logged_metrics = ("batch_accuracy", "rows", "train/examples", "val/margin")

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
        logits = model(batch["x"])
        rows = len(batch["y"])
        log_metric("batch_accuracy", (logits.argmax(-1) == batch["y"]).double().mean(),
                   weight=rows)
        log_metric("rows", rows)
        log_metric("train/examples", torch.tensor(rows), weight=torch.tensor(1))
        return nn.functional.cross_entropy(logits, batch["y"], reduction="sum"), rows

    def predict(self, model: nn.Module, batch: dict[str, Any]) -> list[dict[str, Any]]:
        logits = model(batch["x"])
        log_metric("val/margin", (logits[:, 1] - logits[:, 0]).abs().mean(),
                   weight=len(batch["y"]))
        return super().predict(model, batch)


def build(config: dict[str, Any]) -> SelfLogging:
    return SelfLogging(config)
