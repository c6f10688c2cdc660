"""An archive laid out as its runs saw their world: the task's source and data under a working
folder, a trained tokenizer under the artifacts folder, every piece checked against the hash
the run recorded (not only the manifest's: a member edited together with its manifest line
still fails here, named).

Data a run read from outside its working folder (an absolute ``task.data.train``, a
``../base`` model folder) is placed under ``work/_outside/N/`` and the setting that named it
is pointed there (:func:`relocated_spec`): the path is a setting of the run, not an input of
its arithmetic, so the reproduction differs from the run in that string alone and says so."""

from __future__ import annotations

import json
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from campaign.errors import ReproduceError
from campaign.stack.project import sha256_file
from campaign.stack.provenance import files_digest


@dataclass(frozen=True)
class Unpacked:
    members: Path  # the archive's members, extracted
    work: Path  # the working folder the runs' relative paths are read from
    artifacts: Path
    moved: tuple[tuple[str, str, str], ...] = ()  # (setting, its value, where it now lies)
    imports: tuple[str, ...] = ()  # folders to import from beside ``work``: a run's _roots/N


def unpack(archive: Path, folder: Path) -> Unpacked:
    """Extract ``archive`` (already verified) into ``folder`` and lay its inputs out. Every
    path it writes, or reads from the archive's own manifests, stays inside ``folder``."""
    members = folder / "archive"
    tops = set()
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            top, *relative = PurePosixPath(member.name).parts  # below CAMPAIGN-archive/
            tops.add(top)
            if len(tops) > 1:
                raise ReproduceError(f"{archive}: members under two top folders ({sorted(tops)})"
                                     ": not an archive campaign wrote")
            if not member.isfile() or not relative:
                continue
            target = inside(members, "/".join(relative), f"member {member.name}")
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as source, open(target, "xb") as out:  # type: ignore[union-attr]
                shutil.copyfileobj(source, out)
    inputs = read_json(members, "inputs.json", "no inputs.json: written before archives "
                       "carried what runs read; it cannot be reproduced alone")
    work, artifacts = folder / "work", folder / "artifacts"
    work.mkdir()
    try:
        imports = sorted({str(work / "/".join(name.split("/")[:2]))
                          for source in inputs.get("task_sources", [])
                          for name in _place_source(members, work, source)
                          if name.startswith("_roots/")})
        moved = []
        for index, entry in enumerate(inputs.get("data", [])):
            if entry["member_root"].startswith("_absolute"):
                root = f"_outside/{index}/{PurePosixPath(entry['member_root']).name}"
                moved.append((entry["key"], entry["value"], str((work / root).absolute())))
                entry = {**entry, "member_root": root, "original": entry["member_root"]}
            _place_data(members, work, entry)
        for tokenizer in inputs.get("tokenizers", []):
            member = tokenizer["member"]
            _place(inside(members, member, "a tokenizer"), inside(artifacts, member, "a tokenizer"),
                   tokenizer["sha256"], f"tokenizer {member}")
    except (KeyError, TypeError, AttributeError) as error:
        raise ReproduceError(f"inputs.json: not as campaign writes it ({type(error).__name__}: "
                             f"{error})") from None
    except OSError as error:  # two entries laid out on one path, a full disk
        raise ReproduceError(f"cannot lay the archive's inputs out under {work}: "
                             f"{error.strerror or error} ({error.filename})") from None
    return Unpacked(members, work, artifacts, tuple(moved), tuple(imports))


def inside(base: Path, relative: str, what: str) -> Path:
    """``base / relative``, refused (one line) where the archive's path would leave ``base``:
    an absolute path, ``..``, a backslash, or a link on the way out."""
    if not isinstance(relative, str):
        raise ReproduceError(f"{what}: the archive names a path that is not text: refused")
    parts = PurePosixPath(relative).parts
    if not parts or relative.startswith("/") or ".." in parts or "\\" in relative:
        raise ReproduceError(f"{what}: the archive's path {relative!r} leaves the reproduction's "
                             "folder: refused")
    target = base.joinpath(*parts)
    if not target.resolve().is_relative_to(base.resolve()):
        raise ReproduceError(f"{what}: the archive's path {relative!r} leads out of the "
                             "reproduction's folder: refused")
    return target


def read_json(members: Path, name: str, missing: str) -> Any:
    """A JSON member of the archive, or one line naming what is wrong with it."""
    path = members / name
    if not path.is_file():
        raise ReproduceError(missing)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as error:
        raise ReproduceError(f"{name}: not JSON ({error})") from None


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


def _place_source(members: Path, work: Path, source: dict[str, Any]) -> list[str]:
    """The run's task source laid out under ``work`` (a built-in task's: only checked equal to
    this installation's own); its files' names. A local module the task imported from
    another folder of its ``sys.path`` lies under ``_roots/N/``, imported from there."""
    files = list(source["files"])
    root = inside(members, source["member_root"], "a task source")
    for name in files:
        inside(root, name, "a task source")
        inside(work, name, "a task source")
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
        return []
    for name in files:
        target = work / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / name, target)
    return files


def _place_data(members: Path, work: Path, entry: dict[str, Any]) -> None:
    root = entry["member_root"]
    for file in entry["files"]:
        what = f"{entry['key']} ({entry['value']}{'/' + file['file'] if file['file'] else ''})"
        target = inside(work, root, what)
        target = inside(target, file["file"], what) if file["file"] else target
        if file["member"] is None:
            original = (Path(entry["original"].removeprefix("_absolute"))
                        if "original" in entry else Path(entry["working_directory"]) / root)
            original = original / file["file"] if file["file"] else original
            if not original.is_file():
                raise ReproduceError(f"{what} is listed by hash only (past --data-limit) and "
                                     f"not at {original}: place it there")
            _place(original, target, file["sha256"], what)
        else:
            _place(inside(members, file["member"], what), target, file["sha256"], what)


def _place(source: Path, target: Path, sha256: str, what: str) -> None:
    if not source.is_file():
        raise ReproduceError(f"{what} is not in the archive")
    if sha256_file(source) != sha256:  # in blocks: data past --data-limit can be large
        raise ReproduceError(f"{what} does not hash as recorded: it was changed")
    if target.exists() or target.is_symlink():  # a data entry over a checked source file
        raise ReproduceError(f"{what}: the archive lays two inputs out at {target.name}: "
                             "refused (not an archive campaign wrote)")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
