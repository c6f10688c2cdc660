"""Digits tasks with one training-loop fault each, for the pilot's gates (``task.fault``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from campaign.tasks.digits import DigitsMLP, DigitsTask


class DetachedMLP(DigitsMLP):
    """A bug seen in practice: the first block's output is detached, so it never learns."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x).detach()
        return self.head(x)


class UnsavedScaleMLP(DigitsMLP):
    """State kept in a plain tensor attribute: not in state_dict, lost by the export."""

    def __init__(self, hidden: int) -> None:
        super().__init__(hidden)
        # per-class offsets drawn afresh in every process: should have been a registered buffer
        generator = torch.Generator()
        generator.seed()
        self.offset = torch.randn(10, generator=generator) * 50

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + self.offset


class FaultyPilotDigits(DigitsTask):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.fault = config["task"].get("fault")

    def model(self) -> nn.Module:
        if self.fault == "frozen":
            return DetachedMLP(self.hidden)
        if self.fault == "unsaved_state":
            return UnsavedScaleMLP(self.hidden)
        model = super().model()
        if self.fault == "chatty":  # like nanoGPT's "number of parameters: ..." on stdout
            print(f"number of parameters: {sum(p.numel() for p in model.parameters())}")
        return model

    def predict(self, model: nn.Module, batch: dict[str, Any]) -> list[dict[str, Any]]:
        if self.fault == "predict_in_train_mode":
            model.train()
        if self.fault == "predict_with_grad":
            with torch.enable_grad():
                return super().predict(model, batch)
        records = super().predict(model, batch)
        if self.fault == "sampled_predictions":  # sampling with an unseeded generator
            generator = torch.Generator()
            generator.seed()
            for record in records:
                record["prediction"] = self.classes[
                    int(torch.randint(10, (1,), generator=generator))
                ]
        return records


def build(config: dict[str, Any]) -> FaultyPilotDigits:
    return FaultyPilotDigits(config)
