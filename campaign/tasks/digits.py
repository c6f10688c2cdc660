"""Handwritten digits classification on the 8x8 set that scikit-learn ships inside its package.

No download: the set is the CSV file inside the installed scikit-learn package,
read with numpy as ``sklearn.datasets.load_digits`` reads it, but without
importing scikit-learn (2 s of imports in every process that builds the task:
each run, each pilot check, each replay); a test checks both give the same set.
The label <-> class mapping is explicit (``CLASSES``), so a pilot can
check it rather than trust it. The split is fixed (seeded by
``task.split_seed``), independent of the run's seed, so every run of a
campaign sees the same data.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from campaign.tasks.keys import DigitsKeys

TASK_KEYS = DigitsKeys  # its task.* keys: plan refuses any other

CLASSES = tuple(str(digit) for digit in range(10))  # label id -> class name
TARGET_NAMES = np.arange(10)  # the dataset's names of its targets (load_digits' target_names)


def load_digits_file() -> tuple[np.ndarray, np.ndarray]:
    """(1,797 x 64 pixel intensities 0-16, targets) from scikit-learn's digits.csv.gz."""
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec else None
    if path is None or not path.exists():  # another layout: let scikit-learn find it
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return bunch.data, bunch.target
    data = np.loadtxt(path, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int)


class DigitsTask:
    """A small MLP on 64 pixel intensities; loss is the summed cross-entropy over examples."""

    metrics = ("accuracy",)  # what score() returns: plan checks the spec's metric against it
    random_examples = False  # reading and collating draw nothing: the loader seeds nothing

    def __init__(self, config: dict[str, Any]) -> None:
        options = config.get("task", {})
        self.hidden = int(options.get("hidden", 64))
        self.val_fraction = float(options.get("val_fraction", 0.2))
        self.split_seed = int(options.get("split_seed", 0))
        self.limit = options.get("limit")  # for tests: use only the first N examples
        self.classes = CLASSES
        self._splits: dict[str, list[dict[str, Any]]] | None = None

    def model(self) -> nn.Module:
        return DigitsMLP(self.hidden)

    def splits(self) -> dict[str, Sequence[dict[str, Any]]]:
        if self._splits is None:
            pixels, targets = load_digits_file()
            images = (pixels / 16.0).astype(np.float32)
            order = np.random.default_rng(self.split_seed).permutation(len(images))
            if self.limit is not None:
                order = order[: int(self.limit)]
            examples = [
                {
                    "id": f"digits-{i}",
                    "group": f"digits-{i}",
                    "pixels": images[i],
                    "label": int(targets[i]),
                    # the dataset's own name for the class, to check CLASSES against
                    "class_name": str(TARGET_NAMES[targets[i]]),
                }
                for i in order
            ]
            cut = int(len(examples) * (1 - self.val_fraction))
            self._splits = {"train": examples[:cut], "val": examples[cut:]}
        return self._splits

    def collate(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return {
            "x": torch.from_numpy(np.stack([e["pixels"] for e in examples])),
            "y": torch.tensor([e["label"] for e in examples], dtype=torch.long),
            "ids": [e["id"] for e in examples],
        }

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
        logits = model(batch["x"].to(_dtype(model)))
        return nn.functional.cross_entropy(logits, batch["y"], reduction="sum"), len(batch["y"])

    def predict(self, model: nn.Module, batch: dict[str, Any]) -> list[dict[str, Any]]:
        predicted = model(batch["x"].to(_dtype(model))).argmax(dim=-1).tolist()
        return [
            {"id": i, "prediction": self.classes[p], "target": self.classes[t]}
            for i, p, t in zip(batch["ids"], predicted, batch["y"].tolist(), strict=True)
        ]

    def score(self, records: Sequence[dict[str, Any]]) -> dict[str, float]:
        correct = sum(r["prediction"] == r["target"] for r in records)
        return {"accuracy": correct / max(1, len(records))}

    def describe(self, example: dict[str, Any]) -> dict[str, str]:
        shades = " .:-=+*#%@"
        rows = [
            "".join(shades[min(9, int(v * 9.99))] for v in example["pixels"][r * 8 : (r + 1) * 8])
            for r in range(8)
        ]
        return {
            "input": "\n".join(rows),
            "target": f"label {example['label']} = class {self.classes[example['label']]!r}",
            "mask": "every example contributes its one label",
        }

    def control_inputs(self) -> Sequence[dict[str, Any]]:
        return self.splits()["val"][:4]


class DigitsMLP(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(64, hidden), nn.ReLU())])
        self.head = nn.Linear(hidden, len(CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _dtype(model: nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def build(config: dict[str, Any]) -> DigitsTask:
    return DigitsTask(config)
