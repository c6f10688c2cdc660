"""A tiny GPT-shaped language model with tied input and output embeddings (nanoGPT's
``transformer.wte`` shared with ``lm_head``) and its blocks at ``transformer.h``: next-token
prediction on short sequences from a fixed rule, written as a ``campaign.Task``."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

import campaign

VOCAB, LENGTH = 16, 8


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(),
                                 nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class TinyGPT(nn.Module):
    def __init__(self, width: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(VOCAB, width),
            "h": nn.ModuleList(Block(width) for _ in range(layers)),
            "ln_f": nn.LayerNorm(width),
        })
        self.lm_head = nn.Linear(width, VOCAB, bias=False)
        self.lm_head.weight = self.transformer["wte"].weight  # tied, as in nanoGPT

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.transformer["wte"](tokens)
        for block in self.transformer["h"]:
            x = block(x)
        return self.lm_head(self.transformer["ln_f"](x))


class TiedTask(campaign.Task):
    classes = tuple(str(token) for token in range(VOCAB))

    def model(self) -> nn.Module:
        return TinyGPT(int(self.options.get("width", 16)))

    def splits(self) -> dict[str, list[dict[str, Any]]]:
        rng = np.random.default_rng(0)
        rows = []
        for i in range(96):
            start, stride = int(rng.integers(VOCAB)), int(rng.integers(1, 4))
            tokens = (start + stride * np.arange(LENGTH + 1)) % VOCAB
            rows.append({"id": f"s{i}", "group": f"s{i}", "x": tokens[:-1].astype(np.int64),
                         "next": tokens[1:].astype(np.int64), "label": int(tokens[-1])})
        return {"train": rows[:80], "val": rows[80:]}

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
        logits = model(batch["x"])
        total = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch["next"].reshape(-1),
                                            reduction="sum")
        return total, batch["next"].numel()

    def outputs(self, model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        return model(batch["x"])[:, -1]  # the prediction of the last position's next token


def build(config: dict[str, Any]) -> TiedTask:
    return TiedTask(config)
