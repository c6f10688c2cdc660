"""A complete task with a known training-set size, for planning by epochs (``build``), and
an incomplete one that only has ``splits()`` (``build_partial``: planned through the API, its
runs fail in setup)."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field

from campaign.tasks.digits import DigitsTask
from campaign.tasks.keys import DigitsKeys


class TinyKeys(DigitsKeys):
    """A user's task declaring its keys as docs/tasks.md says: the digits keys and its own."""

    train_size: int = Field(3200, ge=1)


TASK_KEYS = TinyKeys


class TinyTask(DigitsTask):
    """The digits task's contract over ``task.train_size`` synthetic training examples."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.size = int(config["task"].get("train_size", 3200))

    def splits(self) -> dict[str, list[dict[str, Any]]]:
        def example(prefix: str, i: int) -> dict[str, Any]:
            pixels = np.full(64, (i % 10) / 10, dtype=np.float32)
            return {"id": f"{prefix}{i}", "group": f"{prefix}{i}", "pixels": pixels,
                    "label": i % 10}

        return {"train": [example("t", i) for i in range(self.size)],
                "val": [example("v", i) for i in range(10)]}


class SplitsOnly:
    def __init__(self, config: dict[str, Any]) -> None:
        self.size = int(config["task"].get("train_size", 3200))

    def splits(self) -> dict[str, list[dict[str, Any]]]:
        return {
            "train": [{"id": f"t{i}"} for i in range(self.size)],
            "val": [{"id": f"v{i}"} for i in range(10)],
        }


def build(config: dict[str, Any]) -> TinyTask:
    return TinyTask(config)


def build_partial(config: dict[str, Any]) -> SplitsOnly:
    return SplitsOnly(config)


NOT_CALLABLE = 3


def build_without_splits(config: dict[str, Any]) -> object:
    """A factory whose object cannot say how many training examples there are."""
    return object()
