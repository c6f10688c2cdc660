"""The loop's errors, in a module without torch: the command line catches them without paying
for a torch import (DESIGN.md §11: commands that do not train never import torch)."""

from __future__ import annotations

import errno

# A volume that takes no more bytes: full, over quota, or over the process's file-size limit.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class LoopError(ValueError):
    """A run that cannot be executed as configured (said before any work)."""


class DeviceUnavailable(LoopError):
    """A device that is a valid name but cannot run here (exit 1: the checked thing)."""


RESUME_REFUSED = "stays interrupted, its resume refused"  # a resume that could not start


class RunSetupFailed(LoopError):
    """The run was taken and could not be built; its end is recorded: ``failed`` for a first
    start, ``interrupted`` (resumable, nothing lost) for a resume (``status``)."""

    def __init__(self, message: str, status: str = "failed") -> None:
        super().__init__(message)
        self.status = status


class CheckpointError(ValueError):
    """A checkpoint that must not be loaded: missing, torn, tampered with, not ours."""


class TaskContractError(ValueError):
    """The task does not import, cannot be built, or lacks a part of the contract."""


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its type name when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def out_of_storage(error: BaseException) -> str | None:
    """Why ``error`` (or what caused it) is a volume that takes no more bytes, or None. Such a
    run has lost nothing but the updates since its last checkpoint: it ends ``interrupted``,
    resumable once there is space, never ``failed`` for good. safetensors raises its own
    error around the Rust I/O error ("No space left on device (os error 28)")."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in NO_SPACE:
            return f"{seen.strerror} (errno {seen.errno})"
        for number in NO_SPACE:
            if f"(os error {number})" in str(seen):
                return f"{first_line(seen)}"
        seen = seen.__cause__ or seen.__context__
    return None


def storage_stop_detail(reason: str, phase: str, step: int, run_id: str) -> str:
    """The one line an ``interrupted`` run ended by a full volume records."""
    return (f"no space to write in {phase} at update {step}: {reason}; free space on the "
            f"artifacts volume, then `campaign resume {run_id}` continues from its last "
            "checkpoint")
