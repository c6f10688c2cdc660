"""The wine script (examples/porting/train_wine.py) ported to a campaign task, as
docs/porting.md walks it: its ``build_model`` and ``load_arrays`` imported unchanged; what the
task adds is what the campaign's loop, gates and report need to know (examples with ids and
class names, a loss as a sum over its units).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

import campaign
from examples.porting.train_wine import build_model, load_arrays

PRELOAD = ("sklearn.datasets",)  # imported once by the task host, before it forks a run
CULTIVARS = ("class_0", "class_1", "class_2")  # the data set's own names for the labels


class Wine(campaign.Task):
    classes = CULTIVARS

    def model(self) -> nn.Module:
        return build_model(int(self.options.get("hidden", 32)))

    def splits(self) -> dict[str, list[dict[str, Any]]]:
        arrays = load_arrays(int(self.options.get("split_seed", 0)))

        def examples(split: str) -> list[dict[str, Any]]:
            return [{"id": f"wine-{row}", "x": x, "label": int(y),
                     "class_name": CULTIVARS[int(y)]}
                    for row, x, y in zip(arrays[f"{split}_rows"], arrays[f"{split}_x"],
                                         arrays[f"{split}_y"], strict=True)]

        return {"train": examples("train"), "val": examples("val")}

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
        logits = self.outputs(model, batch)  # the script's mean, as a sum and its count
        return nn.functional.cross_entropy(logits, batch["label"], reduction="sum"), len(logits)

    def training_order(self, seed: int, per_update: int) -> Iterator[list[int]]:
        """The script's own draw of each step's rows (``loop.sampling = "task"``): its
        generator, seeded as the script seeds it, over the training rows in the same order."""
        size = len(load_arrays(int(self.options.get("split_seed", 0)))["train_y"])
        generator = torch.Generator().manual_seed(seed)
        while True:
            yield torch.randint(size, (per_update,), generator=generator).tolist()


def build(config: dict[str, Any]) -> Wine:
    return Wine(config)
