"""The digits task with a BatchNorm layer: accumulation is then not one big batch's gradient
(the batch-statistics warning of plan and the pilot)."""

from __future__ import annotations

from typing import Any

import torch

from campaign.tasks.digits import DigitsTask


class NormedDigits(DigitsTask):
    def model(self) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.BatchNorm1d(32),
                                   torch.nn.ReLU(), torch.nn.Linear(32, 10))


def build(config: dict[str, Any]) -> NormedDigits:
    return NormedDigits(config)


class BatchMean(torch.nn.Module):
    """A task's own layer that centres each feature on its batch mean: no type names it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(dim=0, keepdim=True)


class CentredDigits(DigitsTask):
    def model(self) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(64, 32), BatchMean(), torch.nn.ReLU(),
                                   torch.nn.Dropout(0.5), torch.nn.Linear(32, 10))


def centred(config: dict[str, Any]) -> CentredDigits:
    return CentredDigits(config)
