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
