"""What a run read, packed into its campaign's archive: the task's source, its data, a trained
tokenizer, and ``inputs.json`` saying where each came from.

The task's source is the one each run recorded (``environment.task_source``: the module file
or package folder and the local modules it imported, hashed when the run started); a source
that no longer hashes as a run recorded is refused, as a changed artifact is. Data are the
files and folders a run's ``task.*`` strings name, read from the run's recorded working
directory (``task.data.train = "train.jsonl"``, ``task.model_path = "base"``, a user's own
``task.csv``): each is hashed here and packed up to ``data_limit`` bytes in all, the rest
listed with its SHA-256 and size only.
The files a run's task opened for reading under its working folder (``environment.task_reads``,
:mod:`campaign.stack.project`) join them, checked against the run's hash (a changed file is
refused, naming the run) and packed once with a folder a setting names. A tokenizer the
causal-LM task trained (``CAMPAIGN_ARTIFACTS/tokenizers/KEY/``) is packed
under the same key, so a reproduction reads it rather than training its own: only one a run
used (its hash is in the run's ``base_model`` event), not every other campaign's beside it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import stat
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pandas as pd

from campaign.stack.project import sha256_file
from campaign.stack.provenance import named_digest, source_paths

DATA_LIMIT = 256 << 20  # bytes of data packed at most, by default (the rest: hashes only)


class InputsChanged(Exception):
    """The task's source no longer hashes as a run recorded it; the message names the run."""


def pack_inputs(runs: pd.DataFrame, artifact_paths: list[str], add: Callable[[str, bytes], None],
                add_file: Callable[[str, Path, str, int], None], data_limit: int = DATA_LIMIT,
                events_text: str = "") -> dict[str, Any]:
    """Add every input of ``runs`` through ``add(name, bytes)`` (a data file through
    ``add_file(name, path, sha256, size)``: streamed, never read whole); return
    ``inputs.json``. ``events_text`` is the runs' event details, where a trained tokenizer's
    hash is named."""
    sources = _pack_sources(runs, add)
    data, packed_bytes = [], 0
    for entry in _data_entries(runs):
        files = _files(entry.pop("resolved_path"))
        member_files = []
        for path, relative in files:
            size = path.stat().st_size
            digest = sha256_file(path)
            member = None
            if packed_bytes + size <= data_limit:
                member = f"inputs/{entry['member_root']}/{relative}".rstrip("/")
                add_file(member, path, digest, size)
                packed_bytes += size
            member_files.append({"file": relative, "sha256": digest, "bytes": size,
                                 "member": member})
        data.append({**entry, "files": member_files})
    tokenizers = []
    for root in sorted({Path(p).absolute().parent.parent / "tokenizers" for p in artifact_paths}):
        for path in sorted(root.glob("*/tokenizer.json")):
            member = f"tokenizers/{path.parent.name}/tokenizer.json"
            content = path.read_bytes()
            digest = hashlib.sha256(content).hexdigest()
            if f"({digest[:16]})" not in events_text:
                continue  # another campaign's tokenizer, cached beside this one's
            add(member, content)
            tokenizers.append({"member": member, "sha256": digest})
    return {"task_sources": sources, "data": data, "data_limit": data_limit,
            "data_packed_bytes": packed_bytes, "tokenizers": tokenizers}


def with_late_inputs(runs: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with each run's ``inputs_late`` events (what its task imported or read after
    its environment was recorded) in its environment as ``inputs_late``: a list."""
    late = events[events["kind"] == "inputs_late"]
    if late.empty:
        return runs
    found: dict[str, list[Any]] = {}
    for row in late.itertuples():
        with contextlib.suppress(ValueError, TypeError):
            found.setdefault(str(row.run_id), []).append(json.loads(row.detail))
    runs = runs.copy()
    runs["environment"] = [{**(environment or {}), "inputs_late": found[run_id]}
                           if run_id in found else environment
                           for run_id, environment in zip(runs["run_id"], runs["environment"],
                                                          strict=True)]
    return runs


def recorded_sources(environment: dict[str, Any]) -> list[dict[str, Any]]:
    """The task sources a run recorded: at its start, then any imported later."""
    late = [item.get("task_source") for item in environment.get("inputs_late") or []]
    return [s for s in (environment.get("task_source"), *late) if s]


def recorded_reads(environment: dict[str, Any]) -> list[dict[str, Any]]:
    """The files a run recorded its task read: once built, then any read later."""
    late = [read for item in environment.get("inputs_late") or []
            for read in item.get("task_reads") or []]
    return [*(environment.get("task_reads") or []), *late]


def _pack_sources(runs: pd.DataFrame, add: Callable[[str, bytes], None]) -> list[dict[str, Any]]:
    """Each distinct recorded task source, checked against its files now and packed once."""
    sources: dict[str, dict[str, Any]] = {}
    for run in runs.itertuples():
        for recorded in recorded_sources(run.environment or {}):  # (none: from before)
            entry = sources.setdefault(recorded["sha256"], {**recorded, "run_ids": []})
            entry["run_ids"].append(run.run_id)
    for digest, entry in sources.items():
        named = source_paths(entry)
        missing = [path for _, path in named if not path.is_file()]
        first = entry["run_ids"][0]
        if missing:
            raise InputsChanged(f"run {first}: its task source {missing[0]} is missing")
        if named_digest(named) != digest:
            raise InputsChanged(f"run {first}: its task source under {entry['root']} (or a "
                                "local module it imported) changed since the run recorded it: "
                                "refused (commit or restore it)")
        for name, path in named:
            add(f"source/{digest[:16]}/{name}", path.read_bytes())
        entry["member_root"] = f"source/{digest[:16]}"
    return list(sources.values())


def _data_entries(runs: pd.DataFrame) -> Iterator[dict[str, Any]]:
    """One entry per distinct existing path a run's task strings name."""
    seen: dict[str, dict[str, Any]] = {}
    for run in runs.itertuples():
        environment = run.environment or {}
        folder = environment.get("working_directory")
        if folder is None:
            continue
        for key, value in _strings((run.config or {}).get("task") or {}, "task"):
            path = Path(value).expanduser()
            resolved = path if path.is_absolute() else Path(folder) / path
            if not (resolved.is_file() or resolved.is_dir()) or not value.strip():
                continue
            if Path(folder).resolve().is_relative_to(resolved.resolve()):
                continue  # ".", "/", "~": the working folder or above it is not a data input
            root = (PurePosixPath(value).as_posix() if not path.is_absolute()
                    and ".." not in path.parts else f"_absolute{resolved.resolve()}")
            entry = seen.setdefault(_where(resolved), {
                "key": key, "value": value, "working_directory": folder, "member_root": root,
                "kind": "folder" if resolved.is_dir() else "file", "run_ids": [],
                "resolved_path": resolved})
            entry["run_ids"].append(run.run_id)
    hashes: dict[Path, str] = {}  # each file read hashed once, checked against every run
    for run in runs.itertuples():  # then the files a run's task opened (campaign.stack.project)
        environment = run.environment or {}
        folder = environment.get("working_directory")
        for read in recorded_reads(environment) if folder else []:
            resolved = Path(folder) / read["path"]
            _unchanged(resolved, read, run.run_id, hashes)  # whoever packs it
            if not resolved.is_symlink() and any(  # (a folder packs no link: packed apart)
                    resolved.resolve().is_relative_to(Path(other["resolved_path"]).resolve())
                    for other in seen.values() if other["kind"] == "folder"):
                continue  # packed with the folder a setting names
            entry = seen.setdefault(_where(resolved), {
                "key": "read", "value": read["path"], "working_directory": folder,
                "member_root": read["path"], "kind": "file", "run_ids": [],
                "resolved_path": resolved})
            if run.run_id not in entry["run_ids"]:
                entry["run_ids"].append(run.run_id)
    yield from seen.values()


def _where(path: Path) -> str:
    """One input's place, whichever names it (a setting, a read): its folder resolved, its own
    name kept (a link is packed where it lies, as the run opened it)."""
    return str(path.parent.resolve() / path.name)


def _unchanged(path: Path, read: dict[str, Any], run_id: str, hashes: dict[Path, str]) -> None:
    """A file as the run read it, or :class:`InputsChanged` naming the run and the file."""
    try:
        found = path.stat()
    except OSError:
        raise InputsChanged(f"run {run_id} read {path}, which is gone: restore it") from None
    if not stat.S_ISREG(found.st_mode):
        raise InputsChanged(f"run {run_id} read {path}, which is no longer a regular file: "
                            "refused unread")
    if found.st_size == read.get("bytes") and read.get("sha256") and path not in hashes:
        hashes[path] = sha256_file(path)
    same = found.st_size == read.get("bytes") and (
        hashes.get(path) == read["sha256"] if read.get("sha256")
        else found.st_mtime_ns == read.get("mtime_ns"))
    if not same:
        raise InputsChanged(f"run {run_id} read {path}, which changed since: refused (restore "
                            "the file the run read)")


def _strings(document: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(document, dict):
        for key, value in document.items():
            yield from _strings(value, f"{where}.{key}")
    elif isinstance(document, list):
        for index, value in enumerate(document):
            yield from _strings(value, f"{where}[{index}]")
    elif isinstance(document, str) and len(document) < 4096:
        yield where, document


def _files(path: Path) -> list[tuple[Path, str]]:
    """(file, name relative to the input) for a file ("") or every file under a folder."""
    if path.is_file():
        return [(path, "")]
    return [(p, p.relative_to(path).as_posix()) for p in sorted(path.rglob("*"))
            if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts]
