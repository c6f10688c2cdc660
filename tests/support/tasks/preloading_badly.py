"""A user's task whose ``PRELOAD`` names a library that exits at import and the task's own
module: the host imports neither (the probe exits 3; its own module is never the host's)."""

from __future__ import annotations

from tests.support.tasks.quick import build

PRELOAD: tuple[str, ...] = (
    "tests.support.tasks.exiting_library",
    "tests.support.tasks.preloading_badly",
)

__all__ = ["build"]
