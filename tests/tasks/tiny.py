"""A task factory with a known training-set size, for planning by epochs."""

from __future__ import annotations

from typing import Any


class TinyTask:
    def __init__(self, config: dict[str, Any]) -> None:
        self.size = int(config["task"].get("train_size", 3200))

    def splits(self) -> dict[str, list[dict[str, Any]]]:
        return {
            "train": [{"id": f"t{i}"} for i in range(self.size)],
            "val": [{"id": f"v{i}"} for i in range(10)],
        }


def build(config: dict[str, Any]) -> TinyTask:
    return TinyTask(config)


NOT_CALLABLE = 3


def build_without_splits(config: dict[str, Any]) -> object:
    """A factory whose object cannot say how many training examples there are."""
    return object()
