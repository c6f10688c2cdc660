"""The loop's errors, in a module without torch: the command line catches them without paying
for a torch import (DESIGN.md §11: commands that do not train never import torch)."""

from __future__ import annotations


class LoopError(ValueError):
    """A run that cannot be executed as configured (said before any work)."""


class DeviceUnavailable(LoopError):
    """A device that is a valid name but cannot run here (exit 1: the checked thing)."""


class RunSetupFailed(LoopError):
    """The run left ``planned`` and failed while being built; its end is recorded as failed."""


class CheckpointError(ValueError):
    """A checkpoint that must not be loaded: missing, torn, tampered with, not ours."""


class TaskContractError(ValueError):
    """The task does not import, cannot be built, or lacks a part of the contract."""


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its type name when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
