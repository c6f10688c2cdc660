"""The loader benchmark's task: reading an example costs ~2 ms of CPU (a decode or an
augmentation stands in as a busy loop), the model is small: an input-bound run."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

import campaign

COST_S = 0.002


class Decoded(Dataset[dict[str, Any]]):
    def __init__(self, size: int, offset: int = 0) -> None:
        self.size, self.offset = size, offset

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        until = time.process_time() + COST_S  # CPU time: what a decode costs
        while time.process_time() < until:
            pass
        rng = np.random.default_rng(self.offset + index)
        x = rng.standard_normal(32).astype(np.float32)
        return {"id": f"e{self.offset + index}", "x": x, "label": int(x[:4].sum() > 0)}


class DecodeTask(campaign.Task):
    classes = ("no", "yes")

    def model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))

    def splits(self) -> dict[str, Any]:
        return {"train": Decoded(4096), "val": Decoded(16, offset=10**6)}

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
        logits = self.outputs(model, batch)
        return nn.functional.cross_entropy(logits, batch["label"], reduction="sum"), len(logits)


def build(config: dict[str, Any]) -> DecodeTask:
    return DecodeTask(config)
