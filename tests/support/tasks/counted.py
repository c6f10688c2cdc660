"""The augmented task with every read of a training example counted in this process
(``READS``: index -> reads): how often the pilot reads its training split."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tests.support.tasks.augmented import Augmented, Generated

READS: Counter[int] = Counter()


class Counted(Generated):
    def __getitem__(self, index: int) -> dict[str, Any]:
        READS[index] += 1
        return super().__getitem__(index)


class CountedTask(Augmented):
    def splits(self) -> dict[str, Any]:
        splits = super().splits()  # new split objects on every call, as a user's may make
        splits["train"] = Counted(splits["train"].size, 0, augment=True)
        return splits


def build(config: dict[str, Any]) -> CountedTask:
    return CountedTask(config)
