"""A user's task that names, in ``PRELOAD``, a library its host should import once: the host
reads the tuple from this file and never imports this module itself."""

from __future__ import annotations

from typing import Any

import tests.support.tasks.preloaded_library  # noqa: F401 - what PRELOAD names
from tests.support.tasks.quick import build as quick_build

PRELOAD = ("tests.support.tasks.preloaded_library",)


def build(config: dict[str, Any]) -> Any:
    return quick_build(config)
