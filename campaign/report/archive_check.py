"""``campaign verify-archive``: every member of an archive checked against its manifest.

Streaming, and safe against a hostile file: names that leave the folder, links,
duplicates, unlisted members and sizes other than the manifest's are refused from their
headers, before a byte is inflated; a pax extended header or a GNU long name is refused
when larger than :data:`HEADER_LIMIT` (``tarfile`` reads such a header whole into
memory: a multi-gigabyte one ended in a MemoryError); a manifest that lists nothing, or
lacks the spec and the campaign's record, is refused; and the spec inside must hash to
the manifest's ``spec_sha256`` (a ``spec.json`` edited together with its member hash
would otherwise pass).
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from campaign.errors import ArchiveUnusable
from campaign.ledger.canonical import canonical_json, sha256_text
from campaign.report.archive import MANIFEST, ArchiveError
from campaign.report.archive_records import (
    RECORD_LIMIT,
    check_recorded_inputs,
    is_record,
    slim,
)

HEADER_LIMIT = 1 << 20  # a pax header or long name of ours is a few hundred bytes
SPEC_LIMIT = 16 << 20  # a spec is at most 1 MiB of TOML (MAX_SPEC_BYTES); as JSON a few
REQUIRED = ("spec.json", "campaign.json")  # every archive of ours holds these


@dataclass(frozen=True)
class Verification:
    members: int
    bytes: int


class _HeaderBomb(Exception):
    """A pax header or GNU long name over :data:`HEADER_LIMIT` (not a TarError: tarfile
    must not swallow it as the end of the archive)."""


class _BoundedTarInfo(tarfile.TarInfo):
    """TarInfo that refuses an oversized extended header before tarfile reads it whole
    (``_proc_pax`` and ``_proc_gnulong`` are where the standard library reads it)."""

    def _proc_pax(self, tarfile_: Any) -> Any:
        self._refuse_large("pax extended header")
        return super()._proc_pax(tarfile_)

    def _proc_gnulong(self, tarfile_: Any) -> Any:
        self._refuse_large("GNU long name")
        return super()._proc_gnulong(tarfile_)

    def _proc_sparse(self, tarfile_: Any) -> Any:
        # A sparse member's holes read as zeros without input: a 408-byte archive could make
        # the check hash a petabyte, and a chain of sparse headers grows without bound.
        raise _HeaderBomb("a sparse member (never in an archive of ours)")

    def _refuse_large(self, what: str) -> None:
        if self.size > HEADER_LIMIT:
            raise _HeaderBomb(f"a {what} of {self.size:,} bytes (more than {HEADER_LIMIT:,})")


def verify_archive(path: Path) -> Verification:
    """Check every member of the archive at ``path`` against its manifest, streaming.

    Two sequential passes over the gzip stream, never more than one buffer of a member in
    memory: the first reads the manifest (the first member, schema-checked) and then only the
    headers (refusing unsafe names, links, duplicates, unlisted members and any size other
    than the manifest's before its bytes are inflated: a bomb is refused unread); the second
    hashes each member in 1 MiB blocks. :class:`ArchiveUnusable` for input that is not an
    archive of ours, :class:`ArchiveError` for one that does not verify.
    """
    if not path.is_file():
        raise ArchiveUnusable(f"{path}: no such file")
    manifest = _manifest_of(path)
    listed = manifest.members
    seen: set[str] = set()
    total, spec = 0, None
    records: dict[str, bytes | None] = {}  # inputs.json and each run's environment.json
    for member, handle in _members(path):
        if member.name.endswith(f"/{MANIFEST}") and member.name.count("/") == 1:
            continue
        expected = _check_listed(path, member, listed)
        digest, kept = hashlib.sha256(), bytearray()
        relative = member.name.split("/", 1)[-1]
        record = is_record(relative)
        keep = member.size <= (RECORD_LIMIT if record else SPEC_LIMIT) and (
            record or relative == "spec.json")
        for block in iter(lambda: _read(path, handle, 1 << 20), b""):  # noqa: B023 - read now
            digest.update(block)
            if keep:
                kept += block
        if digest.hexdigest() != expected.sha256:
            raise ArchiveError(f"{path}: {member.name} does not match its SHA-256 in the manifest")
        if relative == "spec.json":
            spec = bytes(kept) if keep else None
        elif record:
            records[relative] = slim(relative, bytes(kept)) if keep else None  # None: too big
        seen.add(member.name)
        total += member.size
    missing = sorted(set(listed) - seen)
    if missing:
        raise ArchiveError(f"{path}: {missing[0]} is listed in the manifest but missing")
    _check_spec(path, spec, (manifest.model_extra or {}).get("spec_sha256"))
    check_recorded_inputs(path, records, {name.split("/", 1)[-1] for name in seen})
    return Verification(len(seen), total)


def _check_spec(path: Path, spec: bytes | None, recorded: Any) -> None:
    """The spec inside is the spec the manifest names by hash: its bytes are the text the
    ledger stored and hashed, or (archives written before issue 26) a JSON document whose
    canonical form is."""
    if spec is None:
        raise ArchiveError(f"{path}: spec.json is missing or over {SPEC_LIMIT:,} bytes")
    if hashlib.sha256(spec).hexdigest() == recorded:
        return
    try:
        document = json.loads(spec)
    except ValueError:
        raise ArchiveError(f"{path}: spec.json is not JSON") from None
    actual = sha256_text(canonical_json(document))
    if actual != recorded:
        raise ArchiveError(f"{path}: spec.json hashes to {actual[:12]}, the manifest's "
                           f"spec_sha256 is {str(recorded)[:12]}: the spec was changed")


class _Listed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0)


class _Manifest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    members: dict[str, _Listed]


MANIFEST_LIMIT = 64 << 20  # a manifest lists names and hashes: far below this


def _manifest_of(path: Path) -> _Manifest:
    """First pass: every header checked for safety, and the manifest read and validated."""
    names: set[str] = set()
    manifest: _Manifest | None = None
    listed: dict[str, _Listed] = {}
    for member, handle in _members(path):
        if member.name in names:
            raise ArchiveError(f"{path}: {member.name} appears twice in the archive")
        names.add(member.name)
        is_manifest = member.name.endswith(f"/{MANIFEST}") and member.name.count("/") == 1
        if manifest is None:  # the first member
            if not is_manifest:
                raise ArchiveUnusable(f"{path}: its first member is {member.name}, not "
                                      f"{MANIFEST}: not an archive written by campaign")
            if member.size > MANIFEST_LIMIT:
                raise ArchiveUnusable(f"{path}: {member.name} is {member.size:,} bytes: not a "
                                      "manifest")
            manifest = _parse_manifest(path, _read(path, handle, MANIFEST_LIMIT))
            listed = manifest.members
        elif is_manifest:
            raise ArchiveError(f"{path}: a second manifest {member.name}: refused")
        else:  # refused by its header, before a byte of it is inflated
            _check_listed(path, member, listed)
    if manifest is None:
        raise ArchiveUnusable(f"{path}: an empty archive, no {MANIFEST} inside")
    return manifest


def _read(path: Path, handle: Any, size: int) -> bytes:
    """Up to ``size`` bytes of a member; a damaged stream is a failed verification."""
    try:
        return bytes(handle.read(size))
    except (OSError, tarfile.TarError, EOFError, zlib.error) as error:
        raise ArchiveError(f"{path}: damaged .tar.gz archive ({error})") from None


def _parse_manifest(path: Path, document: bytes) -> _Manifest:
    try:
        manifest = _Manifest.model_validate_json(document)
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(str(p) for p in problem["loc"]) or "the document"
        raise ArchiveUnusable(f"{path}: {MANIFEST} is malformed at {where}: "
                              f"{problem['msg']}") from None
    for name in manifest.members:
        _check_name(path, name)
    held = {name.split("/", 1)[-1] for name in manifest.members}
    absent = [name for name in REQUIRED if name not in held]
    if absent:
        what = "lists no member" if not manifest.members else f"does not list {absent[0]}"
        raise ArchiveError(f"{path}: {MANIFEST} {what}: it does not verify")
    return manifest


def _check_listed(path: Path, member: tarfile.TarInfo, listed: dict[str, _Listed]) -> _Listed:
    expected = listed.get(member.name)
    if expected is None:
        raise ArchiveError(f"{path}: {member.name} is not in the manifest")
    if member.size != expected.bytes:
        raise ArchiveError(f"{path}: {member.name} holds {member.size:,} bytes, the manifest "
                           f"says {expected.bytes:,}: refused unread")
    return expected


def _members(path: Path) -> Iterator[tuple[tarfile.TarInfo, Any]]:
    """The archive's members in order, each with a stream of its bytes (stream mode: one pass,
    no seeking back), after its name and type are checked."""
    started = False
    try:
        with tarfile.open(path, "r|gz", tarinfo=_BoundedTarInfo) as tar:
            for member in tar:
                started = True
                _check_name(path, member.name)
                if member.sparse is not None or member.issparse():  # holes cost no input
                    raise ArchiveError(f"{path}: member {member.name} is a sparse file: "
                                       "refused unread")
                if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
                    kind = "a link" if member.issym() or member.islnk() else "not a plain file"
                    raise ArchiveError(f"{path}: member {member.name} is {kind}: refused")
                handle = tar.extractfile(member)
                if handle is None:
                    raise ArchiveError(f"{path}: member {member.name} cannot be read")
                yield member, handle
    except _HeaderBomb as error:
        raise ArchiveError(f"{path}: {error}: refused unread") from None
    except (OSError, tarfile.TarError, EOFError, zlib.error, MemoryError) as error:
        if started:  # an archive of ours, damaged on the way: it does not verify
            raise ArchiveError(f"{path}: damaged .tar.gz archive ({error})") from None
        raise ArchiveUnusable(f"{path}: not a readable .tar.gz archive ({error})") from None


def _check_name(path: Path, name: str) -> None:
    parts = PurePosixPath(name).parts
    if name.startswith("/") or ".." in parts or "\\" in name or not parts:
        raise ArchiveError(f"{path}: member name {name!r} leaves the archive's folder: refused")


