"""A very small real task for launcher tests: a linear classifier on 64 made-up examples.

Runs of a few updates finish in well under a second, so a hundred of them
test scheduling rather than arithmetic. ``task.sleep_s`` slows each collate
down, to keep a run in the middle of its updates long enough to kill it; ``task.gate``
names a file whose presence holds every collate until it is removed, so a test that
stops or kills a worker mid-run knows the run cannot have ended first, however loaded
the machine (the gate's path is part of the config, as any option: a reference run
names the same path, absent then).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn


class QuickTask:
    def __init__(self, config: dict[str, Any]) -> None:
        options = config.get("task", {})
        generator = torch.Generator().manual_seed(int(options.get("data_seed", 0)))
        self.size = int(options.get("size", 64))
        self.x = torch.randn(self.size, 8, generator=generator, dtype=torch.float64)
        self.y = (self.x[:, 0] > 0).long()
        self.sleep_s = float(options.get("sleep_s", 0.0))
        self.gate = Path(options["gate"]) if options.get("gate") else None

    def model(self) -> nn.Module:
        return nn.Linear(8, 2).double()

    def splits(self) -> dict[str, Sequence[dict[str, Any]]]:
        rows = [{"id": i, "row": i} for i in range(self.size)]
        return {"train": rows, "val": rows[:16]}

    def collate(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        while self.gate is not None and self.gate.exists():
            time.sleep(0.01)
        index = torch.tensor([e["row"] for e in examples])
        return {"x": self.x[index], "y": self.y[index], "ids": [e["id"] for e in examples]}

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
        logits = model(batch["x"])
        return nn.functional.cross_entropy(logits, batch["y"], reduction="sum"), len(batch["y"])

    def predict(self, model: nn.Module, batch: dict[str, Any]) -> list[dict[str, Any]]:
        predicted = model(batch["x"]).argmax(-1).tolist()
        return [
            {"id": i, "prediction": p, "target": t}
            for i, p, t in zip(batch["ids"], predicted, batch["y"].tolist(), strict=True)
        ]

    def score(self, records: Sequence[dict[str, Any]]) -> dict[str, float]:
        return {"accuracy": sum(r["prediction"] == r["target"] for r in records) / len(records)}

    def describe(self, example: dict[str, Any]) -> dict[str, str]:
        return {"input": f"row {example['row']}", "target": str(int(self.y[example["row"]]))}

    def control_inputs(self) -> Sequence[dict[str, Any]]:
        return self.splits()["val"][:4]


def build(config: dict[str, Any]) -> QuickTask:
    return QuickTask(config)
