"""What a task took from the user's project beyond its own module: the local modules it
imported and the files it opened for reading, so a run's record and its archive hold the
project as the run used it (docs/tasks.md, "What a run records of your project").

A ported script is rarely one file: the task module imports the original script beside it
and reads a data file by a relative path. Both are found by watching, from the moment the
first task is loaded in a process (:func:`start`, called by the task loader):

- **modules**: every module imported since, whose file lies outside the installed
  distributions (the standard library, every site-packages) and outside this tool's own
  package: sibling modules and local packages (and any under the project folders, whenever
  imported: a ``PRELOAD`` sibling);
- **reads**: every path opened for reading since, through Python's ``open``, ``io.open``
  or ``os.open`` (their ``open`` audit event, :pep:`578`), kept when it is a regular file
  under the run's working folder (a link must lead there too) and not code or this tool's
  own files (artifacts, checkpoints), nor one the task opened for writing (its own
  output). A file a task reads through a native library (pyarrow, safetensors) is not
  seen: name it in a ``task.*`` setting, and the archive packs it from there.

What was seen before :func:`start` (a test runner's own modules, a notebook's files) is not
the task's. A host forks its runs from a process that imported the task: a run inherits
what the import read and adds its own.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import site
import stat
import sys
import sysconfig
from pathlib import Path
from typing import Any

HASH_LIMIT = 64 << 20  # a file read past this is recorded by size and mtime, hashed by archive
HASHED_LIMIT = 1 << 30  # bytes hashed at most per record; past them, sizes and mtimes only
READS_LIMIT = 1000  # files recorded at most (a folder of images: name it in a task setting)
WATCHED_LIMIT = 100_000  # paths kept at most while watching (per-example opens go unrecorded)
NEVER = (Path("/proc"), Path("/sys"), Path("/dev"))  # not files a task's result depends on
CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyd", ".so")  # a .pth in a project is weights
OWN_PACKAGE = Path(__file__).resolve().parents[1]  # campaign/: named by its version instead

_before: set[str] | None = None  # the modules already imported when watching began
_reads: dict[str, None] = {}  # absolute paths opened for reading, in order
_written: set[str] = set()  # paths opened for writing: the task's own output, not an input


def start() -> None:
    """Begin watching this process's imports and reads (once; later calls change nothing)."""
    global _before
    if _before is not None:
        return
    _before = set(sys.modules)
    sys.addaudithook(_heard)


def _heard(event: str, arguments: tuple[Any, ...]) -> None:
    """The audit hook: an exception here would surface in the task's own ``open``."""
    if event != "open":
        return
    try:
        path, mode, flags = arguments
        if path is None or isinstance(path, int) or len(_reads) >= WATCHED_LIMIT:
            return  # a descriptor already open, or enough watched
        name = os.fsdecode(path)
        if mode is None and not os.path.isabs(name):
            return  # os.open may resolve it against a dir_fd the event does not name
        name = os.path.abspath(name)
        # "r+" (numpy's memmap) reads what is there; "w", "a", "x" and O_CREAT/O_TRUNC make it
        writes = (any(letter in mode for letter in "wax") if mode is not None
                  else flags is not None and flags & os.O_ACCMODE != os.O_RDONLY
                  and bool(flags & (os.O_CREAT | os.O_TRUNC | os.O_APPEND)))
        if writes:
            _written.add(name)
        else:
            _reads.setdefault(name)
    except Exception:  # never in the task's way
        pass


@functools.cache
def installed_locations() -> tuple[Path, ...]:
    """Where installed code lives: the standard library, every site-packages (the
    environment's, the user's) and any folder on ``sys.path`` named like one. Not the whole
    prefix: a system Python's ``/usr`` would hide a project under ``/usr/src/app``."""
    names = ("stdlib", "platstdlib", "purelib", "platlib")
    found = {sysconfig.get_path(n) for n in names}
    with contextlib.suppress(Exception):
        found |= {*site.getsitepackages(), site.getusersitepackages()}
    found |= {p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")}
    return tuple(sorted({Path(p).resolve() for p in found if p}))


def local_modules(project: tuple[Path, ...] = ()) -> list[tuple[Path, str]]:
    """(the folder on ``sys.path`` it was imported from, its file relative to that folder)
    for every module imported since :func:`start` from outside the installed distributions,
    and every one under the ``project`` folders whenever it was imported (a sibling module a
    task's ``PRELOAD`` names is imported by the task host before any task is loaded)."""
    if _before is None:
        return []
    installed = installed_locations()
    mine = [folder.resolve() for folder in project]
    found: dict[Path, tuple[Path, str]] = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if name == "__main__" or not isinstance(file, str):
            continue
        path = Path(file).resolve()
        if path.suffix != ".py" or not path.is_file() or path.is_relative_to(OWN_PACKAGE):
            continue
        if name in _before and not any(path.is_relative_to(folder) for folder in mine):
            continue
        if any(path.is_relative_to(place) for place in installed):
            continue
        depth = name.count(".") + (path.name == "__init__.py")
        if depth >= len(path.parents):
            continue
        root = path.parents[depth]
        found[path] = (root, path.relative_to(root).as_posix())
    return sorted(found.values())


def files_read(working_directory: Path, excluded: list[Path]) -> list[dict[str, Any]]:
    """Every regular file opened for reading under ``working_directory`` since :func:`start`
    (not code, not under ``excluded`` nor an installed location): its path relative to the
    folder, its size, and its SHA-256 (up to :data:`HASH_LIMIT`; past it, its mtime)."""
    folder = working_directory.resolve()
    skipped = [p.resolve() for p in excluded] + [*installed_locations(), *NEVER]
    records: dict[str, dict[str, Any]] = {}
    hashed = 0
    for name in list(_reads):
        path = Path(name)
        if path.suffix in CODE_SUFFIXES or "__pycache__" in path.parts or ".git" in path.parts:
            continue
        if name in _written or len(records) >= READS_LIMIT:
            continue
        try:
            found = path.stat()
        except OSError:
            continue  # gone since, or never there (a failed open is audited too)
        if not stat.S_ISREG(found.st_mode):
            continue
        absolute = Path(os.path.normpath(name))
        target = path.resolve()  # a link to /etc/passwd is not the project's, wherever it lies
        if not (absolute.is_relative_to(folder) and target.is_relative_to(folder)) or any(
                where.is_relative_to(p) for p in skipped for where in (absolute, target)):
            continue
        relative = absolute.relative_to(folder).as_posix()
        record: dict[str, Any] = {"path": relative, "bytes": found.st_size}
        if found.st_size <= HASH_LIMIT and hashed + found.st_size <= HASHED_LIMIT:
            record["sha256"] = sha256_file(path)
            hashed += found.st_size
        else:
            record["sha256"], record["mtime_ns"] = None, found.st_mtime_ns
        records[relative] = record
    return [records[key] for key in sorted(records)]


def sha256_file(path: Path) -> str:
    """The file's SHA-256, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
