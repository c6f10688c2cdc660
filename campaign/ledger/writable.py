"""Whether a SQLite ledger can take writes now: its volume full, its mount or file read-only.

A worker asks before each claim (docs/runs.md, faults). A run claimed on a ledger that cannot
take its writes is a seed burned: it fails at its first write, or trains without recording.
A worker that cannot write therefore claims nothing and says which file and why; the runs it
would have taken stay ``planned``. The runs already training treat the same condition as an
outage they ride out (outage.py): the volume may be freed, the mount made writable again.

PostgreSQL answers for itself (a full disk there is the server's error on the claim, which
then changes nothing); only a file the workers write directly needs looking at.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import URL

from campaign.errors import LedgerUnwritable

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


def refuse_if_unwritable(url: URL) -> None:
    """Before a claim: raise :class:`LedgerUnwritable` naming the file and the cause, if
    there is one."""
    from campaign.ledger.connections import safe_url, sqlite_path

    cause = why_unwritable(sqlite_path(url))
    if cause is not None:
        raise LedgerUnwritable(
            f"ledger {safe_url(url)} cannot take writes: {cause}; no run was claimed (the "
            "planned ones wait); free the volume or make it writable, then start again")


def _which_is(path: Path) -> str:
    return "the file" if not os.access(path, os.W_OK) else "its folder"
