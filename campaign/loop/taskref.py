"""Import a task factory from its reference ``package.module:factory``.

The working directory is importable, as with ``python -m``: a user's own
task module next to the spec file is found without installing it.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from campaign.errors import TaskReferenceError
from campaign.stack import project


def load_factory(reference: str) -> Callable[[dict[str, Any]], Any]:
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise TaskReferenceError(f"expected package.module:factory, got {reference!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    project.start()  # what the task imports and reads from here on is part of its runs' record
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # any failure of the user's module is a bad reference
        raise TaskReferenceError(
            f"cannot import {module_name!r} ({type(error).__name__}: {error})"
        ) from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise TaskReferenceError(f"module {module_name!r} has no callable {attribute!r}")
    return factory
