"""What every engine's task shares (Ray, SLURM): the refusal to place, the launch's working
directory, and the worker options as plain values.

An engine ships a task's arguments to another process (often another
machine) as plain values: the worker options as a document and the launch's
working directory, so that a task reference such as ``mytasks:build``
resolves there as it did at launch.
"""

from __future__ import annotations

import os
import sys

__all__ = ["PlacementError", "enter", "options_document", "options_from"]

from campaign.launch.worker import options_document, options_from


class PlacementError(RuntimeError):
    """An executor cannot place this campaign (missing extra, no scheduler, impossible request)."""


def enter(cwd: str) -> None:
    """Work in the launch's directory, with it on the import path (a task's module)."""
    if os.path.isdir(cwd):
        os.chdir(cwd)
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
