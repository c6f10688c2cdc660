"""An archive laid out as its runs saw their world: the task's source and data under a working
folder, a trained tokenizer under the artifacts folder, every piece checked against the hash
the run recorded (not only the manifest's: a member edited together with its manifest line
still fails here, named)."""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from campaign.gates.provenance import files_digest


class ReproduceError(Exception):
    """A piece of the archive is missing, changed or unusable; the message names it."""


@dataclass(frozen=True)
class Unpacked:
    members: Path  # the archive's members, extracted
    work: Path  # the working folder the runs' relative paths are read from
    artifacts: Path


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
                             "what runs read; it cannot be reproduced alone")  # fmt: skip
    inputs = json.loads(inputs_path.read_text())
    work, artifacts = folder / "work", folder / "artifacts"
    work.mkdir()
    for source in inputs.get("task_sources", []):
        _place_source(members, work, source)
    for entry in inputs.get("data", []):
        _place_data(members, work, entry)
    for tokenizer in inputs.get("tokenizers", []):
        _place(members / tokenizer["member"], artifacts / tokenizer["member"],
               tokenizer["sha256"], f"tokenizer {tokenizer['member']}")
    return Unpacked(members, work, artifacts)


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
        import campaign

        installed = Path(campaign.__file__).resolve().parent.parent
        paths = [installed / name for name in files]
        same = all(p.is_file() for p in paths) and files_digest(installed, paths)
        if same != source["sha256"]:
            raise ReproduceError(f"the installed campaign's {files[0]} is not the one run "
                                 f"{source['run_ids'][0]} ran: install the campaign version "
                                 "its environment.json names")  # fmt: skip
        return
    for name in files:
        target = work / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / name, target)


def _place_data(members: Path, work: Path, entry: dict[str, Any]) -> None:
    root = entry["member_root"]
    if root.startswith("_absolute"):
        raise ReproduceError(f"{entry['key']} = {entry['value']!r} is outside the run's working "
                             "folder: reproduce places data only below it")  # fmt: skip
    for file in entry["files"]:
        what = f"{entry['key']} ({entry['value']}{'/' + file['file'] if file['file'] else ''})"
        target = work / root / file["file"] if file["file"] else work / root
        if file["member"] is None:
            original = Path(entry["working_directory"]) / root / file["file"]
            if not original.is_file():
                raise ReproduceError(f"{what} is listed by hash only (past --data-limit) and "
                                     f"not at {original}: place it there")  # fmt: skip
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
