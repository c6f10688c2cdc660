"""What a campaign leaves for the future, in one file, and the check that it is intact.

``campaign archive`` writes a gzipped tar with the frozen spec, every run's
resolved config and environment, the raw metrics (every segment) and the
events as Parquet, the validation predictions, output logs, tracebacks and
final artifacts (safetensors) of every run, the pilot's phase table, the notes, the HTML
report, a README on how to reload and replay, and ``MANIFEST.json``: the
SHA-256 and size of every other member. Artifacts are verified against the
ledger's hashes before they are packed (a file that changed since is
refused). ``campaign verify-archive`` streams every member (nothing is
extracted to disk, nothing held whole in memory) and checks it against the
manifest: a flipped byte, a missing, unlisted, duplicated or oversized member,
a link or a name that leaves the archive's folder is named.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from campaign.ledger import Ledger
from campaign.report.atomic import check_target, write_atomically
from campaign.report.balance import balance_sheet
from campaign.report.inputs import campaign_inputs
from campaign.report.render import html

MANIFEST = "MANIFEST.json"
FOLDERS = {"final": "finals", "predictions": "predictions", "log": "logs",
           "traceback": "tracebacks"}  # fmt: skip
PACKED_KINDS = tuple(FOLDERS)


class ArchiveError(Exception):
    """An archive that cannot be written or does not verify; the message names the member."""


@dataclass(frozen=True)
class Verification:
    members: int
    bytes: int


def write_archive(ledger: Ledger, campaign: str, output: Path) -> Path:
    """Pack ``campaign`` into ``output`` (a .tar.gz), atomically."""
    inputs = campaign_inputs(ledger, campaign)
    check_target(output, inputs)  # an unusable path is said before minutes of packing
    record = ledger.campaign(campaign)
    runs = ledger.runs(campaign)
    root = f"{campaign}-archive"
    members: dict[str, bytes] = {}

    def add(name: str, data: bytes) -> None:
        members[f"{root}/{name}"] = data

    add("spec.json", _json(record.spec_document))
    add("campaign.json", _json({"name": record.name, "question": record.question,
                                "task": record.task, "spec_sha256": record.spec_sha256,
                                "created_at": str(record.created_at)}))  # fmt: skip
    for run in runs.itertuples():
        add(f"runs/{run.run_id}/config.json", _json(run.config))
        add(f"runs/{run.run_id}/environment.json", _json(run.environment))
    add("runs.parquet", _parquet(runs.drop(columns=["config", "environment"])))
    add("metrics.parquet", _parquet(ledger.metrics(campaign, all_segments=True)))
    add("events.parquet", _parquet(ledger.events(campaign)))
    add("segments.parquet", _parquet(ledger.segments(campaign)))
    sheet = balance_sheet(ledger, campaign)
    add("pilot-phases.parquet", _parquet(ledger.phases(campaign)))
    add("notes.json", _json(json.loads(sheet.notes.to_json(orient="records", date_format="iso"))))
    add("report.html", html(sheet).encode())
    artifacts = ledger.artifacts(campaign)
    packed = artifacts[artifacts["kind"].isin(PACKED_KINDS)]
    for artifact in packed.itertuples():
        data = Path(artifact.path).read_bytes() if Path(artifact.path).exists() else None
        if data is None:
            raise ArchiveError(f"artifact {artifact.id} of run {artifact.run_id}: "
                               f"{artifact.path} is missing")  # fmt: skip
        if hashlib.sha256(data).hexdigest() != artifact.sha256:
            raise ArchiveError(f"artifact {artifact.id} of run {artifact.run_id}: {artifact.path} "
                               "no longer matches the ledger's SHA-256: refused")  # fmt: skip
        folder = FOLDERS[artifact.kind]
        add(f"{folder}/{artifact.run_id}/{Path(artifact.path).name}", data)
    add("README.md", _readme(record.name, record.task).encode())
    manifest = {
        "campaign": record.name, "spec_sha256": record.spec_sha256,
        "members": {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
                    for name, data in sorted(members.items())},
    }  # fmt: skip
    members = {f"{root}/{MANIFEST}": _json(manifest), **members}  # first: checked before the rest

    def packed_into(temporary: Path) -> None:
        with tarfile.open(temporary, "w:gz") as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
                tar.addfile(info, io.BytesIO(data))

    return write_atomically(output, packed_into, inputs)


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
    listed = _manifest_of(path)
    seen: set[str] = set()
    total = 0
    for member, handle in _members(path):
        if member.name.endswith(f"/{MANIFEST}") and member.name.count("/") == 1:
            continue
        expected = _check_listed(path, member, listed)
        digest = hashlib.sha256()
        for block in iter(lambda: _read(path, handle, 1 << 20), b""):  # noqa: B023 - read now
            digest.update(block)
        if digest.hexdigest() != expected.sha256:
            raise ArchiveError(f"{path}: {member.name} does not match its SHA-256 in the manifest")
        seen.add(member.name)
        total += member.size
    missing = sorted(set(listed) - seen)
    if missing:
        raise ArchiveError(f"{path}: {missing[0]} is listed in the manifest but missing")
    return Verification(len(seen), total)


class ArchiveUnusable(ArchiveError):
    """Not an archive this tool can check: missing, not a .tar.gz, no or a malformed manifest."""


class _Listed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0)


class _Manifest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    members: dict[str, _Listed]


MANIFEST_LIMIT = 64 << 20  # a manifest lists names and hashes: far below this


def _manifest_of(path: Path) -> dict[str, _Listed]:
    """First pass: every header checked for safety, and the manifest read and validated."""
    names: set[str] = set()
    listed: dict[str, _Listed] | None = None
    for member, handle in _members(path):
        if member.name in names:
            raise ArchiveError(f"{path}: {member.name} appears twice in the archive")
        names.add(member.name)
        is_manifest = member.name.endswith(f"/{MANIFEST}") and member.name.count("/") == 1
        if listed is None:  # the first member
            if not is_manifest:
                raise ArchiveUnusable(f"{path}: its first member is {member.name}, not "
                                      f"{MANIFEST}: not an archive written by campaign")
            if member.size > MANIFEST_LIMIT:
                raise ArchiveUnusable(f"{path}: {member.name} is {member.size:,} bytes: not a "
                                      "manifest")  # fmt: skip
            listed = _parse_manifest(path, _read(path, handle, MANIFEST_LIMIT))
        elif is_manifest:
            raise ArchiveError(f"{path}: a second manifest {member.name}: refused")
        else:  # refused by its header, before a byte of it is inflated
            _check_listed(path, member, listed)
    if listed is None:
        raise ArchiveUnusable(f"{path}: an empty archive, no {MANIFEST} inside")
    return listed


def _read(path: Path, handle: Any, size: int) -> bytes:
    """Up to ``size`` bytes of a member; a damaged stream is a failed verification."""
    try:
        return bytes(handle.read(size))
    except (OSError, tarfile.TarError, EOFError, zlib.error) as error:
        raise ArchiveError(f"{path}: damaged .tar.gz archive ({error})") from None


def _parse_manifest(path: Path, document: bytes) -> dict[str, _Listed]:
    try:
        manifest = _Manifest.model_validate_json(document)
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(str(p) for p in problem["loc"]) or "the document"
        raise ArchiveUnusable(f"{path}: {MANIFEST} is malformed at {where}: "
                              f"{problem['msg']}") from None  # fmt: skip
    for name in manifest.members:
        _check_name(path, name)
    return manifest.members


def _check_listed(path: Path, member: tarfile.TarInfo, listed: dict[str, _Listed]) -> _Listed:
    expected = listed.get(member.name)
    if expected is None:
        raise ArchiveError(f"{path}: {member.name} is not in the manifest")
    if member.size != expected.bytes:
        raise ArchiveError(f"{path}: {member.name} holds {member.size:,} bytes, the manifest "
                           f"says {expected.bytes:,}: refused unread")  # fmt: skip
    return expected


def _members(path: Path) -> Iterator[tuple[tarfile.TarInfo, Any]]:
    """The archive's members in order, each with a stream of its bytes (stream mode: one pass,
    no seeking back), after its name and type are checked."""
    started = False
    try:
        with tarfile.open(path, "r|gz") as tar:
            for member in tar:
                started = True
                _check_name(path, member.name)
                if not member.isfile():
                    kind = "a link" if member.issym() or member.islnk() else "not a plain file"
                    raise ArchiveError(f"{path}: member {member.name} is {kind}: refused")
                handle = tar.extractfile(member)
                if handle is None:
                    raise ArchiveError(f"{path}: member {member.name} cannot be read")
                yield member, handle
    except (OSError, tarfile.TarError, EOFError, zlib.error) as error:
        if started:  # an archive of ours, damaged on the way: it does not verify
            raise ArchiveError(f"{path}: damaged .tar.gz archive ({error})") from None
        raise ArchiveUnusable(f"{path}: not a readable .tar.gz archive ({error})") from None


def _check_name(path: Path, name: str) -> None:
    parts = PurePosixPath(name).parts
    if name.startswith("/") or ".." in parts or "\\" in name or not parts:
        raise ArchiveError(f"{path}: member name {name!r} leaves the archive's folder: refused")


def _json(document: Any) -> bytes:
    return json.dumps(document, indent=2, sort_keys=True, default=str).encode()


def _parquet(frame: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    plain = frame.copy()
    for column in plain.columns:  # decoded JSON documents go back to text
        if any(isinstance(v, dict | list) for v in plain[column]):  # (empty frames too)
            plain[column] = plain[column].map(lambda v: None if v is None else json.dumps(v))
    plain.to_parquet(buffer, index=False)
    return buffer.getvalue()


def _readme(name: str, task: str) -> str:
    return f"""# Archive of campaign `{name}`

Everything the campaign left, checked by `campaign verify-archive THIS.tar.gz`
(every member's SHA-256 is in `MANIFEST.json`).

- `spec.json`: the frozen spec; `campaign.json`: question, task, spec hash.
- `runs/RUN_ID/config.json` and `environment.json`: each run's resolved config
  and the software stack it ran on; `runs.parquet`: statuses and stop causes.
- `metrics.parquet`: every metric point of every segment (a resumed run's
  replayed steps included: take the highest `segment_id` per step to read as
  the ledger does); `events.parquet`, `segments.parquet`.
- `predictions/RUN_ID/*.parquet`: validation predictions.
- `finals/RUN_ID/final.safetensors`: weights, config, environment and control
  outputs of every run that finished (no pickle anywhere).
- `pilot-phases.parquet`, `notes.json`, `report.html` (open in a browser).

Reload and replay a final artifact (outputs for the task's control inputs are
compared with those recorded at the end of training):

```bash
pip install campaign   # the version in environment.json
python -m campaign.loop.replay finals/RUN_ID/final.safetensors {task}
```

From Python: `safetensors.torch.load_file(path)` gives the tensors;
`safetensors.safe_open(path, "pt").metadata()` the JSON documents.
"""
