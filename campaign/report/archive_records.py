"""The archive holds what its runs recorded they used: ``verify-archive``'s last check.

The manifest proves each member is intact, not that the members a run needs are there: an
archive written without a run's local module, or with a data file it read left out, verified
while ``reproduce`` failed on it. Each run's ``environment.json`` names its task source (by
digest and file names, local modules included) and the files its task read
(:mod:`campaign.stack.project`); each must be in ``inputs.json`` and, unless listed by hash
only past ``--data-limit``, packed.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from campaign.errors import ArchiveError
from campaign.report.archive_inputs import recorded_reads, recorded_sources


def is_record(relative: str) -> bool:
    """Whether a member (named below the archive's top folder) is one this check reads."""
    parts = PurePosixPath(relative).parts
    return relative == "inputs.json" or (
        len(parts) == 3 and parts[0] == "runs" and parts[2] == "environment.json")


RECORD_LIMIT = 512 << 20  # an inputs.json of 80,000 files is 23 MB; past this, refused
# What this check reads of a run's environment.json:
KEPT = ("task_source", "task_reads", "working_directory", "inputs_late")


def slim(relative: str, document: bytes) -> bytes:
    """What is kept of a record while the archive streams on: a run's environment (its git
    diff, its distributions) cut to what this check reads; the rest as it was."""
    if relative == "inputs.json":
        return document
    try:
        parsed = json.loads(document)
    except (ValueError, RecursionError):
        return document  # said "not JSON" when checked
    if not isinstance(parsed, dict):
        return document
    return json.dumps({key: parsed[key] for key in KEPT if key in parsed}).encode()


def check_recorded_inputs(path: Path, records: Mapping[str, bytes | None],
                          held: set[str]) -> None:
    """Every run's recorded source and read files are in ``inputs.json`` and among the
    ``held`` members (names below the top folder); :class:`ArchiveError` names the first
    absent. Archives whose runs recorded neither pass as before. A record over
    :data:`RECORD_LIMIT` (None here) or not as campaign writes it is one line too."""
    inputs = _document(path, records, "inputs.json") if "inputs.json" in records else None
    for name in sorted(records):
        if name == "inputs.json":
            continue
        run_id = PurePosixPath(name).parts[1]
        environment = _document(path, records, name)
        if not isinstance(environment, dict):
            continue
        try:
            _check_run(path, run_id, environment, inputs, held)
        except (AttributeError, TypeError, KeyError, ValueError) as error:
            raise ArchiveError(f"{path}: {name} or inputs.json: not as campaign writes it "
                               f"({type(error).__name__}: {error})") from None


def _check_run(path: Path, run_id: str, environment: dict[str, Any], inputs: Any,
               held: set[str]) -> None:
    sources, reads = recorded_sources(environment), recorded_reads(environment)
    if not sources and not reads:
        return
    if not isinstance(inputs, dict):
        raise ArchiveError(f"{path}: run {run_id} recorded its inputs, but the archive has "
                           "no inputs.json: it cannot be reproduced")
    for source in sources:
        _check_source(path, run_id, source, inputs, held)
    for read in reads:
        _check_read(path, run_id, str(environment.get("working_directory")), read, inputs,
                    held)


def _document(path: Path, records: Mapping[str, bytes | None], name: str) -> Any:
    document = records[name]
    if document is None:
        raise ArchiveError(f"{path}: {name} is over {RECORD_LIMIT:,} bytes: not checked, "
                           "refused")
    try:
        return json.loads(document)
    except (ValueError, RecursionError):
        raise ArchiveError(f"{path}: {name}: not JSON") from None


def _check_source(path: Path, run_id: str, source: dict[str, Any], inputs: dict[str, Any],
                  held: set[str]) -> None:
    entry = next((s for s in inputs.get("task_sources") or []
                  if isinstance(s, dict) and s.get("sha256") == source.get("sha256")), None)
    if entry is None:
        raise ArchiveError(f"{path}: run {run_id}'s task source ({source.get('sha256', '')[:12]}) "
                           "is not in inputs.json")
    for name in source.get("files") or []:
        if f"{entry.get('member_root')}/{name}" not in held:
            raise ArchiveError(f"{path}: run {run_id}'s task source file {name} is not in the "
                               "archive")


def _check_read(path: Path, run_id: str, folder: str, read: dict[str, Any],
                inputs: dict[str, Any], held: set[str]) -> None:
    """The read file is one an entry of ``inputs.json`` packed (or listed by hash), found by
    where it lay: a folder a setting named by its absolute path holds it too."""
    name = str(read["path"])
    where = posixpath.normpath(posixpath.join(folder, name))
    for entry in inputs.get("data") or []:
        if not isinstance(entry, dict):
            continue
        root = str(entry.get("member_root", ""))
        base = (root.removeprefix("_absolute") if root.startswith("_absolute")
                else posixpath.join(str(entry.get("working_directory")), root))
        for file in entry.get("files") or []:
            placed = posixpath.join(base, file["file"]) if file.get("file") else base
            if posixpath.normpath(placed) != where:
                continue
            if file.get("member") is None or file["member"] in held:
                if not read.get("sha256") or read["sha256"] == file.get("sha256"):
                    return
                raise ArchiveError(f"{path}: run {run_id} read {name} with SHA-256 "
                                   f"{read['sha256'][:12]}, the archive holds another")
    raise ArchiveError(f"{path}: run {run_id} read {name}, which is not in the archive")
