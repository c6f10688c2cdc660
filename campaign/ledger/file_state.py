"""What keeps a SQLite ledger's file from taking writes now, read from the disk: its volume
full, its mount or the file read-only. Asked before a claim (writable.py) and when SQLite
reports an error of its file (connections.translate_error), to name the cause.
"""

from __future__ import annotations

import os
from pathlib import Path

# What SQLite says when its file cannot take writes now: a full volume; a read-only file or
# mount (an open connection meets it as an I/O error); a -wal/-shm it cannot create.
CANNOT_WRITE_SIGNS = ("database or disk is full", "readonly database", "disk I/O error",
                      "unable to open database file")

# Below this much free space a claim is refused: the run's first writes (its segment, the
# write-ahead log's growth, its first metric batches) would not fit.
MIN_FREE_BYTES = 4 * 1024 * 1024


def why_unwritable(path: Path | None) -> str | None:
    """What keeps the ledger's file ``path`` from taking writes now, in words; None when
    nothing does (or the ledger is not a file)."""
    if path is None or not path.exists():
        return None
    folder = path.parent
    try:
        volume = os.statvfs(folder)
    except OSError as error:
        return f"its folder cannot be read ({error.strerror})"
    if volume.f_flag & os.ST_RDONLY:
        return "its volume is mounted read-only"
    if not os.access(path, os.W_OK) or not os.access(folder, os.W_OK | os.X_OK):
        return f"it is read-only for this user ({_which_is(path)})"
    free = volume.f_bavail * volume.f_frsize
    if free < MIN_FREE_BYTES:
        return f"its volume is full ({free:,} bytes free)"
    return None


def _which_is(path: Path) -> str:
    return "the file" if not os.access(path, os.W_OK) else "its folder"
