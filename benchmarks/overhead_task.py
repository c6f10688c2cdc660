"""Synthetic classification tasks for the loop-overhead benchmark (data made here, no download).

Examples are row indices into one pre-made tensor, so collating costs an
index, exactly what the bare loop does: the comparison measures the loops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

SHAPES = {"mlp": (784, 512, 512, 10), "tiny": (64, 64, 10)}


class SyntheticTask:
    def __init__(self, config: dict[str, Any]) -> None:
        options = config["task"]
        self.shape = SHAPES[options.get("model", "mlp")]
        generator = torch.Generator().manual_seed(0)
        size = int(options.get("size", 4096))
        self.x = torch.randn(size, self.shape[0], generator=generator)
        self.y = torch.randint(0, self.shape[-1], (size,), generator=generator)

    def model(self) -> nn.Module:
        return build_model(self.shape)

    def splits(self) -> dict[str, Sequence[dict[str, Any]]]:
        rows = [{"id": i, "row": i} for i in range(len(self.y))]
        return {"train": rows, "val": rows[:256]}

    def collate(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        index = torch.tensor([e["row"] for e in examples])
        return {"x": self.x[index], "y": self.y[index], "ids": [e["id"] for e in examples]}

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
        return nn.functional.cross_entropy(model(batch["x"]), batch["y"], reduction="sum"), len(
            batch["y"]
        )

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


def build_model(shape: tuple[int, ...]) -> nn.Module:
    layers: list[nn.Module] = []
    for i in range(len(shape) - 1):
        layers.append(nn.Linear(shape[i], shape[i + 1]))
        if i < len(shape) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def build(config: dict[str, Any]) -> SyntheticTask:
    return SyntheticTask(config)
