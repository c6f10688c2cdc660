"""A task whose training examples are generated on access (a lazy ``torch.utils.data.Dataset``,
any size) and randomly augmented with Python's, NumPy's and torch's global generators (each
example when read, each batch at collate), with a dropout model in float64: what loader
workers must keep exact. ``task.fault = "sigterm"``
sends SIGTERM once at the ``task.at``-th training microbatch (``task.marker`` remembers it)."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

import campaign
from tests.support.tasks.interrupt import sigterm_once


class Generated(Dataset[dict[str, Any]]):
    """``size`` examples, each made from its index when read; nothing is stored."""

    def __init__(self, size: int, offset: int, augment: bool) -> None:
        self.size, self.offset, self.augment = size, offset, augment

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        number = self.offset + index
        base = np.random.default_rng(number).standard_normal(8)
        if self.augment:  # random per read: the loader seeds it from the example's place
            base = base + np.random.normal(0, 0.1, 8) + torch.rand(8).numpy() * 0.05
            base[random.randrange(8)] *= -1 if random.random() < 0.1 else 1
        return {"id": f"g{number}", "group": f"g{number}", "x": base.astype(np.float64),
                "label": int(np.random.default_rng(number).standard_normal(8).sum() > 0)}


class Augmented(campaign.Task):
    classes = ("negative", "positive")
    costly_examples = True  # ten million generated on access: the leakage checks sample

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.calls = 0

    def model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2),
                             nn.Linear(16, 2)).double()

    def splits(self) -> dict[str, Any]:
        size = int(self.options.get("train_size", 320))
        return {"train": Generated(size, 0, augment=True),
                "val": Generated(int(self.options.get("val_size", 40)), size, augment=False)}

    def collate(self, examples: Any) -> dict[str, Any]:
        batch = super().collate(examples)  # and a random draw at collate (a batch-level noise)
        batch["x"] = batch["x"] + torch.randn(batch["x"].shape, dtype=batch["x"].dtype) * 0.01
        return batch

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
        self.calls += model.training
        sigterm_once(self.options, self.calls, model.training)
        logits = self.outputs(model, batch)
        return nn.functional.cross_entropy(logits, batch["label"], reduction="sum"), len(logits)


def build(config: dict[str, Any]) -> Augmented:
    return Augmented(config)


class DyingWorker(Augmented):
    """A loader worker that dies without a word (os._exit) when it reads index 50."""

    def splits(self) -> dict[str, Any]:
        splits = super().splits()
        splits["train"] = Fatal(splits["train"].size, 0, True)
        return splits


class Fatal(Generated):
    def __getitem__(self, index: int) -> dict[str, Any]:
        from torch.utils.data import get_worker_info

        if index >= 50 and get_worker_info() is not None:
            os._exit(3)
        return super().__getitem__(index)


def build_dying(config: dict[str, Any]) -> DyingWorker:
    return DyingWorker(config)


class Shortened(Augmented):
    """A dataset that says it has more examples than it can read: index 40 and above fail."""

    def splits(self) -> dict[str, Any]:
        splits = super().splits()
        train = splits["train"]

        class Short(Generated):
            def __getitem__(self, index: int) -> dict[str, Any]:
                if index >= 40:
                    raise KeyError(f"no example {index} on disk")
                return super().__getitem__(index)

        splits["train"] = Short(train.size, train.offset, train.augment)
        return splits


def build_shortened(config: dict[str, Any]) -> Shortened:
    return Shortened(config)


class Undeclared(Augmented):
    """Says its reads draw nothing (``random_examples = False``): they do (the data gate's
    ``random_examples_declared`` check catches it)."""

    random_examples = False


def build_undeclared(config: dict[str, Any]) -> Undeclared:
    return Undeclared(config)


class Jittered(Augmented):
    """Predictions that carry the collate's noise in full (each example's logits): a replay
    reproduces them only when both processes draw that noise alike."""

    def predict(self, model: nn.Module, batch: dict[str, Any]) -> list[dict[str, Any]]:
        records = super().predict(model, batch)
        logits = self.outputs(model, batch).tolist()
        return [{**record, "logits": values} for record, values in zip(records, logits,
                                                                       strict=True)]


def build_jittered(config: dict[str, Any]) -> Jittered:
    return Jittered(config)
