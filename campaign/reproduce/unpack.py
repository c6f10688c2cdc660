"""An archive laid out as its runs saw their world: the task's source and data under a working
folder, a trained tokenizer under the artifacts folder, every piece checked against the hash
the run recorded (not only the manifest's: a member edited together with its manifest line
still fails here, named).

Data a run read from outside its working folder (an absolute ``task.data.train``, a
``../base`` model folder) is placed under ``work/_outside/N/`` and the setting that named it
is pointed there (:func:`relocated_spec`): the path is a setting of the run, not an input of
its arithmetic, so the reproduction differs from the run in that string alone and says so."""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from campaign.errors import ReproduceError
from campaign.stack.provenance import files_digest


@dataclass(frozen=True)
class Unpacked:
    members: Path  # the archive's members, extracted
    work: Path  # the working folder the runs' relative paths are read from
    artifacts: Path
    moved: tuple[tuple[str, str, str], ...] = ()  # (setting, its value, where it now lies)


def unpack(archive: Path, folder: Path) -> Unpacked:
    """Extract ``archive`` (already verified) into ``folder`` and lay its inputs out."""
    members = folder / "archive"
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            relative = PurePosixPath(member.name).parts[1:]  # below CAMPAIGN-archive/
            if not member.isfile() or not relative:
                continue
            target = members.joinpath(*relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as source, open(target, "xb") as out:  # type: ignore[union-attr]
                shutil.copyfileobj(source, out)
    inputs_path = members / "inputs.json"
    if not inputs_path.is_file():
        raise ReproduceError(f"{archive}: no inputs.json: written before archives carried "
                             "what runs read; it cannot be reproduced alone")
    inputs = json.loads(inputs_path.read_text())
    work, artifacts = folder / "work", folder / "artifacts"
    work.mkdir()
    for source in inputs.get("task_sources", []):
        _place_source(members, work, source)
    moved = []
    for index, entry in enumerate(inputs.get("data", [])):
        if entry["member_root"].startswith("_absolute"):
            root = f"_outside/{index}/{PurePosixPath(entry['member_root']).name}"
            moved.append((entry["key"], entry["value"], str((work / root).absolute())))
            entry = {**entry, "member_root": root, "original": entry["member_root"]}
        _place_data(members, work, entry)
    for tokenizer in inputs.get("tokenizers", []):
        _place(members / tokenizer["member"], artifacts / tokenizer["member"],
               tokenizer["sha256"], f"tokenizer {tokenizer['member']}")
    return Unpacked(members, work, artifacts, tuple(moved))


def relocated_spec(spec: Any, moved: tuple[tuple[str, str, str], ...], where: str = "") -> Any:
    """``spec`` (the frozen JSON) with each moved setting's value pointed at its new place,
    wherever the setting is given (``hold``, ``config``, a variant's ``set``)."""
    if isinstance(spec, list):
        return [relocated_spec(item, moved, where) for item in spec]
    if not isinstance(spec, dict):
        return spec
    out = {}
    for key, value in spec.items():
        path = f"{where}.{key}" if where else key
        for setting, old, new in moved:
            if value == old and (path == setting or path.endswith(f".{setting}")):
                value = new
        out[key] = relocated_spec(value, moved, path)
    return out


def _place_source(members: Path, work: Path, source: dict[str, Any]) -> None:
    files = list(source["files"])
    root = members / source["member_root"]
    missing = [name for name in files if not (root / name).is_file()]
    if missing:
        raise ReproduceError(f"task source {missing[0]} is not in the archive")
    if files_digest(root, [root / name for name in files]) != source["sha256"]:
        raise ReproduceError(f"task source {', '.join(files)} does not hash as run "
                             f"{source['run_ids'][0]} recorded: the archive was changed")
    if files[0].startswith("campaign/"):  # a built-in task: this installation must hold it
        installed = Path(__file__).resolve().parents[2]  # where this campaign/ is installed
        paths = [installed / name for name in files]
        same = all(p.is_file() for p in paths) and files_digest(installed, paths)
        if same != source["sha256"]:
            raise ReproduceError(f"the installed campaign's {files[0]} is not the one run "
                                 f"{source['run_ids'][0]} ran: install the campaign version "
                                 "its environment.json names")
        return
    for name in files:
        target = work / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / name, target)


def _place_data(members: Path, work: Path, entry: dict[str, Any]) -> None:
    root = entry["member_root"]
    for file in entry["files"]:
        what = f"{entry['key']} ({entry['value']}{'/' + file['file'] if file['file'] else ''})"
        target = work / root / file["file"] if file["file"] else work / root
        if file["member"] is None:
            original = (Path(entry["original"].removeprefix("_absolute"))
                        if "original" in entry else Path(entry["working_directory"]) / root)
            original = original / file["file"] if file["file"] else original
            if not original.is_file():
                raise ReproduceError(f"{what} is listed by hash only (past --data-limit) and "
                                     f"not at {original}: place it there")
            _place(original, target, file["sha256"], what)
        else:
            _place(members / file["member"], target, file["sha256"], what)


def _place(source: Path, target: Path, sha256: str, what: str) -> None:
    if not source.is_file():
        raise ReproduceError(f"{what} is not in the archive")
    if hashlib.sha256(source.read_bytes()).hexdigest() != sha256:
        raise ReproduceError(f"{what} does not hash as recorded: it was changed")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
