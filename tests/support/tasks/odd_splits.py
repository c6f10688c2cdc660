"""The digits task whose ``splits()`` returns something training cannot read
(``task.splits``: none, generator, no_val, negative, empty_train)."""

from __future__ import annotations

from typing import Any

from campaign.tasks.digits import DigitsTask


class _Negative(list):
    def __len__(self) -> int:
        return -1


class OddSplits(DigitsTask):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.kind_of = config["task"].get("splits")

    def splits(self) -> Any:
        real = super().splits()
        return {
            "none": None,
            "generator": {"train": (e for e in real["train"]), "val": real["val"]},
            "no_val": {"train": real["train"]},
            "negative": {"train": _Negative(real["train"]), "val": real["val"]},
            "empty_train": {"train": [], "val": real["val"]},
        }.get(self.kind_of, real)


def build(config: dict[str, Any]) -> OddSplits:
    return OddSplits(config)
