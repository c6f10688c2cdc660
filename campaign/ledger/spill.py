"""Metric points a run could not write while its ledger was away (docs/runs.md, faults).

A run keeps training through an outage: its metric writer keeps the points in memory up to
``KEEP_IN_MEMORY``, then appends them to a file in the run's folder, and writes them when the
ledger answers, the file first, in order. Writes are idempotent on (segment, key, step), so a
batch written twice (the writer died between its commit and the file's removal) is stored
once. JSON lines of plain lists: nothing here is ever unpickled.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SPILL_NAME = "metrics-spill.jsonl"
KEEP_IN_MEMORY = 50_000  # points; about 10 MB of tuples


class SpillFile:
    """The run folder's file of points waiting for the ledger."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, rows: list[tuple[Any, ...]]) -> None:
        """Add ``rows`` at the end, on disk before returning (a crash keeps them)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.writelines(json.dumps(list(row)) + "\n" for row in rows)
            handle.flush()
            os.fsync(handle.fileno())

    def batches(self, size: int) -> Iterator[list[tuple[Any, ...]]]:
        """The kept rows in order, ``size`` at a time (a torn last line, from a crash in the
        middle of an append, is skipped: its points were in memory, not yet promised)."""
        if not self.path.exists():
            return
        batch: list[tuple[Any, ...]] = []
        with open(self.path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    batch.append(tuple(json.loads(line)))
                except json.JSONDecodeError:
                    continue
                if len(batch) >= size:
                    yield batch
                    batch = []
        if batch:
            yield batch

    def __bool__(self) -> bool:
        return self.path.exists()

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
