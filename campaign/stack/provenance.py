"""Where a run's code came from, recorded with its environment so an archive can reproduce it.

Three facts the short stack (:mod:`campaign.stack.software`) leaves out: every installed
distribution and its version (a transformers or peft upgrade changes a run as surely as
torch's), the git state of the task's code with a dirty flag and the diff itself (a
revision alone hides uncommitted edits), and the task's own source, hashed (the module
file or the package folder the task reference names), with the working directory the
run's relative paths are read from. The distributions are listed once per process (a
worker host forks its runs from a process that listed them); the source is hashed per run.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from campaign.stack import project

DIFF_LIMIT = 256 << 10  # a larger diff is recorded by hash and size only
GIT_TIMEOUT_S = 5.0


@functools.cache
def distributions() -> dict[str, str]:
    """Every installed distribution's version, by normalised name (``pip freeze``'s view)."""
    found: dict[str, str] = {}
    for folder in sys.path:  # the dist-info folder names (what pip writes): no METADATA parsed,
        try:  # which took 0.2 s a run for 120 distributions
            entries = os.listdir(folder or ".")
        except OSError:
            continue
        for entry in entries:
            stem, dot, kind = entry.rpartition(".")
            if dot and kind in ("dist-info", "egg-info") and "-" in stem:
                name, _, version = stem.partition("-")
                found.setdefault(name.lower().replace("_", "-"), version.split("-")[0])
    return dict(sorted(found.items()))


def task_source_files(task_reference: str) -> tuple[Path, list[Path]] | None:
    """(the source's root, its files) for the module or package a reference names, found
    without importing it; None when it has no source file (a namespace or a built-in)."""
    module = task_reference.partition(":")[0]
    loaded = sys.modules.get(module)
    origin_name = getattr(loaded, "__file__", None) if loaded is not None else None
    if origin_name is None:
        path = list(sys.path)
        if os.getcwd() not in sys.path:  # where a task reference is imported from (taskref)
            sys.path.append(os.getcwd())
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        finally:
            sys.path[:] = path
        origin_name = spec.origin if spec is not None else None
    if not origin_name or not Path(origin_name).is_file():
        return None
    origin = Path(origin_name).resolve()
    top = module.split(".")[0]
    if "." not in module and origin.name != "__init__.py":
        return origin.parent, [origin]  # a module file next to the spec
    root = origin.parent
    for _ in range(module.count(".") + (origin.name == "__init__.py")):
        root = root.parent  # up to the folder that holds the top package
    if top == "campaign":  # a built-in task: the rest is this tool, named by its version
        own = origin.parent if origin.name == "__init__.py" else None
        return root, sorted(own.rglob("*.py")) if own else [origin]
    package = root / top
    files = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)
    return root, files


def files_digest(root: Path, files: list[Path]) -> str:
    """SHA-256 over each file's path relative to ``root`` and its bytes, in order."""
    return named_digest([(path.relative_to(root).as_posix(), path) for path in files])


def named_digest(files: list[tuple[str, Path]]) -> str:
    """SHA-256 over each (name, file): the name, then the SHA-256 of the file's bytes."""
    digest = hashlib.sha256()
    for name, path in files:
        digest.update(name.encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def task_source(task_reference: str, after: dict[str, Any] | None = None,
                ) -> dict[str, Any] | None:
    """The task's source as a run records it: root, relative file names, digest. Beside the
    task's own files, every local module the task imported (:mod:`campaign.stack.project`):
    one imported from the task's own folder by its name there, one imported from another
    folder on ``sys.path`` (a ``src`` layout, a parent folder) as ``_roots/N/NAME`` with that
    folder in ``roots``: reproduce puts each back on the import path as it was (an edit to
    the original script a task imports changes the run's recorded source). ``after``: a
    source recorded earlier; only the modules imported since, numbered as it numbered its
    folders (a lazy import in ``loss``, recorded when the run ends)."""
    found = task_source_files(task_reference)
    if found is None:
        return None
    root, files = found
    named = [(p.relative_to(root).as_posix(), p) for p in files]
    roots: list[Path] = [Path(r) for r in (after or {}).get("roots") or []]  # numbered alike
    if not task_reference.startswith("campaign."):  # a built-in task imports nothing local
        known = {path for _, path in named}
        for folder, relative in project.local_modules((root, Path.cwd())):
            path = folder / relative
            if path in known:
                continue
            if folder == root:  # imported from the task's own folder: laid out there again
                named.append((relative, path))
                continue
            if folder not in roots:
                roots.append(folder)
            named.append((f"_roots/{roots.index(folder)}/{relative}", path))
    if after is not None:  # what was imported since ``after`` was recorded: the rest only
        had = set(after.get("files") or [])
        named = [(name, path) for name, path in named if name not in had]
        if not named:
            return None
    record: dict[str, Any] = {"root": str(root), "files": [name for name, _ in named],
                              "sha256": named_digest(named)}
    if roots:
        record["roots"] = [str(folder) for folder in roots]
    return record


def source_paths(record: dict[str, Any]) -> list[tuple[str, Path]]:
    """(name, where the file lies) for each file of a recorded task source."""
    root, roots = Path(record["root"]), [Path(r) for r in record.get("roots") or []]
    paths = []
    for name in record["files"]:
        top, _, rest = name.partition("/")
        if top == "_roots" and roots:
            index, _, relative = rest.partition("/")
            paths.append((name, roots[int(index)] / relative))
        else:
            paths.append((name, root / name))
    return paths


def git_state(task_reference: str) -> dict[str, Any] | None:
    """The git revision of the task's folder, whether the tree is dirty, and its diff. One
    ``git status`` says both the revision and whether any tracked file differs from it; the
    diff is asked for only then (every run records this: one git process, not three, in a
    clean tree)."""
    found = task_source_files(task_reference)
    folder = found[0] if found else Path.cwd()
    status = _git(folder, "status", "--porcelain=v2", "--branch", "--no-ahead-behind",
                  "--untracked-files=no")
    lines = (status or "").splitlines()
    revision = next((line.split()[2] for line in lines if line.startswith("# branch.oid ")), None)
    if status is None:  # status failed (a lock, its time limit): the revision, and the diff
        revision = (_git(folder, "rev-parse", "HEAD") or "").strip() or None
    if revision is None or revision == "(initial)":  # not a repository, or no commit yet
        return None
    dirty = any(not line.startswith("#") for line in lines)
    diff = (_git(folder, "diff", "HEAD") or "") if dirty or status is None else ""
    state: dict[str, Any] = {"revision": revision, "dirty": dirty,
                             "diff_sha256": hashlib.sha256(diff.encode()).hexdigest(),
                             "diff_bytes": len(diff.encode())}
    if len(diff.encode()) <= DIFF_LIMIT:
        state["diff"] = diff
    return state


def working_directory() -> str:
    """The folder a run's relative paths (task data, a base model) are read from."""
    return os.getcwd()


def _git(folder: Path, *arguments: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(folder), *arguments], capture_output=True,
                              text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def unread_problem(path: Path, recorded_bytes: int | None) -> str | None:
    """What is wrong with ``path`` before a byte of it is read: not a regular file (a FIFO
    would block the reader for ever, a device never end), or not the size the ledger recorded
    (a 1 TiB sparse file put in a checkpoint's place took minutes to hash). None when it may be
    hashed."""
    try:
        found = os.stat(path)
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    if not stat.S_ISREG(found.st_mode):
        return "is not a regular file"
    if recorded_bytes is not None and found.st_size != recorded_bytes:
        return f"holds {found.st_size:,} bytes where the ledger recorded {recorded_bytes:,}"
    return None
