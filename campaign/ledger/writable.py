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

from sqlalchemy.engine import URL

from campaign.errors import LedgerUnwritable
from campaign.ledger.connections import safe_url, sqlite_path
from campaign.ledger.file_state import why_unwritable


def refuse_if_unwritable(url: URL) -> None:
    """Before a claim: raise :class:`LedgerUnwritable` naming the file and the cause, if
    there is one."""
    cause = why_unwritable(sqlite_path(url))
    if cause is not None:
        raise LedgerUnwritable(
            f"ledger {safe_url(url)} cannot take writes: {cause}; no run was claimed (the "
            "planned ones wait); free the volume or make it writable, then start again")
