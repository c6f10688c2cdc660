"""A volume that takes no more bytes: how a run recognises it and the line it records.

Such a run has lost nothing but the updates since its last checkpoint: it ends
``interrupted``, resumable once there is space, never ``failed`` for good (docs/runs.md).
No torch here: the supervisor reads these too.
"""

from __future__ import annotations

import errno

from campaign.errors import first_line

# A volume that takes no more bytes: full, over quota, or over the process's file-size limit.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def out_of_storage(error: BaseException) -> str | None:
    """Why ``error`` (or what caused it) is a volume that takes no more bytes, or None.
    safetensors raises its own error around the Rust I/O error ("No space left on device
    (os error 28)")."""
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
