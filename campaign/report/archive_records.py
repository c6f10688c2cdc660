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
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from campaign.errors import ArchiveError


def is_record(relative: str) -> bool:
    """Whether a member (named below the archive's top folder) is one this check reads."""
    parts = PurePosixPath(relative).parts
    return relative == "inputs.json" or (
        len(parts) == 3 and parts[0] == "runs" and parts[2] == "environment.json")


def check_recorded_inputs(path: Path, records: Mapping[str, bytes], held: set[str]) -> None:
    """Every run's recorded source and read files are in ``inputs.json`` and among the
    ``held`` members (names below the top folder); :class:`ArchiveError` names the first
    absent. Archives whose runs recorded neither pass as before."""
    inputs = _document(path, records, "inputs.json") if "inputs.json" in records else None
    for name in sorted(records):
        if name == "inputs.json":
            continue
        run_id = PurePosixPath(name).parts[1]
        environment = _document(path, records, name)
        if not isinstance(environment, dict):
            continue
        source = environment.get("task_source")
        reads = environment.get("task_reads") or []
        if not source and not reads:
            continue
        if not isinstance(inputs, dict):
            raise ArchiveError(f"{path}: run {run_id} recorded its inputs, but the archive has "
                               "no inputs.json: it cannot be reproduced")
        if source:
            _check_source(path, run_id, source, inputs, held)
        for read in reads:
            _check_read(path, run_id, environment.get("working_directory"), read, inputs, held)


def _document(path: Path, records: Mapping[str, bytes], name: str) -> Any:
    try:
        return json.loads(records[name])
    except ValueError:
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


def _check_read(path: Path, run_id: str, folder: Any, read: dict[str, Any],
                inputs: dict[str, Any], held: set[str]) -> None:
    name = read.get("path")
    for entry in inputs.get("data") or []:
        if not isinstance(entry, dict) or entry.get("working_directory") != folder:
            continue
        root = str(entry.get("member_root", ""))
        for file in entry.get("files") or []:
            placed = f"{root}/{file.get('file')}" if file.get("file") else root
            if placed != name:
                continue
            if file.get("member") is None or file["member"] in held:
                if not read.get("sha256") or read["sha256"] == file.get("sha256"):
                    return
                raise ArchiveError(f"{path}: run {run_id} read {name} with SHA-256 "
                                   f"{read['sha256'][:12]}, the archive holds another")
    raise ArchiveError(f"{path}: run {run_id} read {name}, which is not in the archive")
