"""The quick task logging metrics of its own (campaign.log_metric): a training batch's accuracy
weighted by its rows, the rows of each microbatch, and a validation batch's mean margin."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from campaign import log_metric
from tests.support.tasks.quick import QuickTask


class SelfLogging(QuickTask):
    metrics = ("accuracy",)  # its score() names: plan checks validation.metric
    logged_metrics = ("batch_accuracy", "rows", "val/margin")

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
        logits = model(batch["x"])
        rows = len(batch["y"])
        log_metric("batch_accuracy", (logits.argmax(-1) == batch["y"]).double().mean(),
                   weight=rows)
        log_metric("rows", rows)
        return nn.functional.cross_entropy(logits, batch["y"], reduction="sum"), rows

    def predict(self, model: nn.Module, batch: dict[str, Any]) -> list[dict[str, Any]]:
        logits = model(batch["x"])
        log_metric("val/margin", (logits[:, 1] - logits[:, 0]).abs().mean(),
                   weight=len(batch["y"]))
        return super().predict(model, batch)


def build(config: dict[str, Any]) -> SelfLogging:
    return SelfLogging(config)
