"""A SQLite ledger serves one host: refuse it on a network filesystem or shared across hosts.

SQLite's locks are file locks; on NFS, SMB and most network filesystems
they are unreliable or absent, and two hosts writing one file can corrupt
it. Claims would then stop being atomic. Workers therefore check, before
they claim anything, that a SQLite ledger lives on a local filesystem and
that no other host holds a live run in it, and point to PostgreSQL instead.
"""

from __future__ import annotations

import socket
from pathlib import Path

from campaign.errors import LedgerError
from campaign.ledger.connections import sqlite_path
from campaign.ledger.leases import live_runs
from campaign.ledger.store import Ledger

NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "afs", "9p", "ceph", "glusterfs",
    "fuse.glusterfs", "lustre", "gpfs", "beegfs", "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse",
    "fuse.rclone", "fuse.juicefs", "davfs", "fuse.davfs2",
})
SHARE_HINT = "use a PostgreSQL ledger (--ledger postgresql://USER@HOST/DB) to share work"


class SQLiteNotShareable(LedgerError):
    """A SQLite ledger used where only a server database is safe."""


def filesystem_type(path: Path, mounts: str) -> str | None:
    """The type of the filesystem holding ``path``, from the text of /proc/mounts."""
    best, kind = "", None
    resolved = str(path.resolve())
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def network_refusal(path: Path, mounts: str) -> str | None:
    """Why a SQLite ledger at ``path`` must not be used, given /proc/mounts; None when local."""
    kind = filesystem_type(path, mounts)
    if kind not in NETWORK_FILESYSTEMS:
        return None
    return (
        f"SQLite ledger {path} lives on a network filesystem ({kind}): SQLite's locks "
        f"are not reliable there; {SHARE_HINT}"
    )


def check_single_host(ledger: Ledger, lease_s: float) -> None:
    """Refuse a SQLite ledger on a network filesystem or with live runs of another host."""
    if ledger.dialect != "sqlite":
        return
    path = sqlite_path(ledger.engine.url)
    if path is None:
        return
    mounts = Path("/proc/mounts")
    refusal = network_refusal(path, mounts.read_text()) if mounts.exists() else None
    if refusal is not None:
        raise SQLiteNotShareable(refusal)
    here = socket.gethostname()
    with ledger.engine.connect() as conn:
        rows = live_runs(conn, lease_s)
    for row in rows:
        host = (row.worker or "").split(":", 1)[0]
        if host and host != here:
            raise SQLiteNotShareable(
                f"SQLite ledger {path} has run {row.id} running on host {host!r} (this is "
                f"{here!r}): a SQLite ledger serves one host; {SHARE_HINT}"
            )


__all__ = ["SQLiteNotShareable", "check_single_host", "filesystem_type", "network_refusal"]
