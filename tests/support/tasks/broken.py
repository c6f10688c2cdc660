"""Built-in tasks with one data fault each (``task.fault``), for the data-gate tests."""

from __future__ import annotations

from typing import Any

import torch

from campaign.tasks.arithmetic import IGNORE, ArithmeticTask
from campaign.tasks.digits import CLASSES, DigitsTask


class BrokenDigits(DigitsTask):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.fault = config["task"].get("fault")
        if self.fault == "swapped_classes":  # two class ids swapped in the mapping table
            self.classes = ("1", "0", *CLASSES[2:])

    def collate(self, examples: Any) -> dict[str, Any]:
        batch = super().collate(examples)
        if self.fault == "collate_shift":  # the examples look right; the loss sees label + 1
            batch["y"] = (batch["y"] + 1) % len(CLASSES)
        elif self.fault == "collate_constant":  # every target 0
            batch["y"] = batch["y"] * 0
        return batch

    def splits(self) -> dict[str, Any]:
        data = super().splits()
        train, val = [dict(e) for e in data["train"]], [dict(e) for e in data["val"]]
        if self.fault == "one_class":  # a single class in every split
            train = [e for e in train if e["label"] == 3]
            val = [e for e in val if e["label"] == 3]
        elif self.fault == "duplicate_ids":
            train[5]["id"] = train[4]["id"]
        elif self.fault == "label_out_of_range":
            train[7]["label"] = 10
        elif self.fault == "group_leak":
            val[0]["group"] = train[0]["group"]
            val[1]["group"] = train[1]["group"]
        return {"train": train, "val": val}


class BrokenArithmetic(ArithmeticTask):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.fault = config["task"].get("fault")

    def encode(self, example: dict[str, Any]) -> tuple[list[int], list[int], bool]:
        inputs, targets, cut = super().encode(example)
        if self.fault in ("prompt_in_loss", "prompt_in_loss_unbounded"):  # prompt not masked
            targets = [t if t != IGNORE else 0 for t in targets]
            targets = [
                inputs[i + 1] if i + 1 < len(inputs) and t == 0 else t
                for i, t in enumerate(targets)
            ]
        return inputs, targets, cut

    def collate(self, examples: Any) -> dict[str, Any]:
        """``collate_prompt_in_loss``: encode() (and so describe()) masks the prompt, but the
        collated targets are the inputs shifted by one everywhere, the prompt included."""
        batch = super().collate(examples)
        if self.fault == "collate_prompt_in_loss":
            shifted = batch["tokens"][:, 1:]
            within = batch["targets"][:, :-1] != IGNORE
            prompt = torch.arange(shifted.shape[1]).unsqueeze(0) < (
                batch["prompt_lengths"].unsqueeze(1) - 1)
            batch["targets"][:, :-1] = torch.where(prompt | within, shifted,
                                                   batch["targets"][:, :-1])
        if self.fault in ("no_prompt_lengths", "prompt_in_loss_unbounded"):  # no boundary given
            del batch["prompt_lengths"]
        return batch


def digits(config: dict[str, Any]) -> BrokenDigits:
    return BrokenDigits(config)


def arithmetic(config: dict[str, Any]) -> BrokenArithmetic:
    return BrokenArithmetic(config)
