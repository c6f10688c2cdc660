"""What the task host imports before it forks a child, so that no child imports it again.

The host imports, once each and on the requester's import path: what a request names (a
run's loop), the project's own module it runs, a built-in task's ``PRELOAD``, and the
libraries a user's task names in its ``PRELOAD``. A user's task module itself is never
imported here (its import-time code, a thread or an exit, belongs in a child): its
``PRELOAD`` is read from its source as a literal. The libraries it names are user-chosen
code, so before the host imports them a probe child imports them first, within
``PROBE_LIMIT_S``: one that hangs, exits or fails at import is never imported here (the
children import it themselves, each with its own time limit and error), and the verdict is
kept for the host's life; the host serves nothing meanwhile (up to 60 s, once a library).
What a preload prints goes to the host's stderr (its answer channel is not fd 1: see
:func:`campaign.host.host_process.main`).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from campaign.host.processes import (
    HOST_SIGNALS,
    TIMEOUT_ENV,
    become_subreaper,
    kill_descendants,
    kill_group,
    leave_host,
)

PROBE_LIMIT_S = 60.0  # a user's declared library that takes longer to import is not preloaded
IMPORTED = 57  # the probe's exit code once the import returned (not one a library exits with)


class Preloads:
    """The host's imports before each fork, and its verdicts on a user's declared libraries."""

    def __init__(self) -> None:
        self.verdicts: dict[str, bool] = {}  # a user's declared library -> safe to import here

    def before_fork(self, request: dict[str, Any]) -> None:
        """Import what the child of ``request`` would import first; never raises (a child that
        needs what failed here imports it itself, and fails there with its own error)."""
        with contextlib.suppress(Exception):
            self._import_for(request)

    def _import_for(self, request: dict[str, Any]) -> None:
        path = import_path(request)
        builtin, declared = task_preloads(request.get("task"), path)
        names = [*request.get("preload", ()), *own_module(request), *builtin]
        with _importing_from(path):
            for name in names:
                _import(name)
            for name in declared:
                if name in sys.modules:
                    continue
                verdict = self.verdicts.get(name)
                if verdict is None:
                    limit = probe_limit(request)
                    verdict = _imports_cleanly(name, limit)
                    if verdict is not None or limit >= PROBE_LIMIT_S:  # a short limit's
                        self.verdicts[name] = bool(verdict)  # time-out is asked again
                if verdict:
                    _import(name)


def own_module(request: dict[str, Any]) -> list[str]:
    """The project's own module a request runs (a call's target, a fresh check's module),
    imported here once rather than in every child: a pilot's resume check or a run's replay
    would otherwise import its part of the loop (a second or more) per check. Only
    ``campaign.`` modules, which do nothing at import; a user's module is never imported here."""
    name = request.get("module") if request.get("kind") == "module" else \
        str(request.get("target", "")).partition(":")[0]
    if not isinstance(name, str) or not name.startswith("campaign."):
        return []
    return [] if name.rsplit(".", 1)[-1] == "__main__" else [name]  # a __main__ runs a command


def import_path(request: dict[str, Any]) -> list[str]:
    """Where the child of ``request`` will import from, relative entries made absolute in the
    requester's directory (the child works there): the requester's path (a call), else the
    directory and PYTHONPATH in front of the host's own, as ``python -m`` has it (a module)."""
    cwd = str(request.get("cwd") or os.getcwd())
    if request.get("path"):
        entries = [str(p) for p in request["path"]]
    else:
        pythonpath = str(request.get("env", {}).get("PYTHONPATH", ""))
        entries = [cwd, *[p for p in pythonpath.split(os.pathsep) if p], *sys.path[1:]]
    if cwd not in entries and "" not in entries:
        entries.append(cwd)  # where a task in the working directory is found (as load_factory)
    return [os.path.join(cwd, entry) if not os.path.isabs(entry) else entry
            for entry in entries]


def task_preloads(task_reference: str | None,
                  path: Sequence[str]) -> tuple[list[str], list[str]]:
    """(a built-in task's module and its ``PRELOAD``, the libraries a user's task names in
    its ``PRELOAD``): the causal-LM task's transformers, a user's scikit-learn, seconds in
    every child otherwise. A user's names never include its task module or its packages."""
    module = (task_reference or "").split(":", 1)[0]
    if not module:
        return [], []
    if module.startswith("campaign.tasks."):
        try:
            return [module, *getattr(importlib.import_module(module), "PRELOAD", ())], []
        except Exception:
            return [], []
    own = {".".join(module.split(".")[:depth]) for depth in range(1, module.count(".") + 2)}
    return [], [name for name in declared_preloads(module, path)
                if name not in own and not name.startswith(module + ".")]


def declared_preloads(module: str, path: Sequence[str] | None = None) -> list[str]:
    """A module's ``PRELOAD`` (a tuple or list of module names, assigned as a literal at its
    top level; the last assignment counts, as at run time) read from its source file, found
    on ``path`` as the import system finds a ``.py`` module; nothing imported. [] when it
    declares none or is not such a file."""
    found: list[str] = []
    try:  # never the host's end: a child that imports the task meets what is wrong
        source = _source_file(module, list(path) if path else sys.path)
        if source is None:
            return []
        for node in ast.parse(source.read_text(encoding="utf-8")).body:
            target = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) and node.value else []
            if any(isinstance(t, ast.Name) and t.id == "PRELOAD" for t in target):
                names = ast.literal_eval(node.value)  # type: ignore[union-attr, arg-type]
                ok = isinstance(names, (tuple, list)) and all(isinstance(n, str) for n in names)
                found = list(names) if ok else []
    except Exception:
        return []
    return found


def _source_file(module: str, path: Sequence[str]) -> Path | None:
    *packages, name = module.split(".")
    folders = [Path(entry or ".") for entry in path]
    for package in packages:
        found = [f / package for f in folders if (f / package).is_dir()]
        regular = [f for f in found if (f / "__init__.py").is_file()]
        folders = regular[:1] or found  # a regular package wins; else all namespace portions
    for folder in folders:  # in one folder a package wins over a module of the same name
        for candidate in (folder / name / "__init__.py", folder / f"{name}.py"):
            if candidate.is_file():
                return candidate
    return None


@contextlib.contextmanager
def _importing_from(path: list[str]) -> Iterator[None]:
    """The requester's import path for the block; the host's own path, signal handlers and
    wake-up fd restored after (a library that installs a SIGTERM or SIGCHLD handler at import
    must not change what the host ignores or how it learns of its children's ends)."""
    own = sys.path[:]
    handlers = {signum: signal.getsignal(signum) for signum in HOST_SIGNALS}
    wake = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wake)
    try:
        sys.path[:] = path
        yield
    finally:
        sys.path[:] = own
        for signum, handler in handlers.items():
            with contextlib.suppress(TypeError, ValueError, OSError):
                signal.signal(signum, handler)
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(wake)


def _import(name: str) -> None:
    if name in sys.modules:
        return
    # Once here, inherited by every later child; one that fails (or exits) is left to fail
    # where a child imports it, with the child's own error.
    with contextlib.suppress(Exception, SystemExit):
        importlib.import_module(name)


def probe_limit(request: dict[str, Any]) -> float:
    """How long a probe may take: ``PROBE_LIMIT_S``, or less where the requester's
    ``CAMPAIGN_TASK_TIMEOUT_S`` says so (a hung library made a command with a 5 s limit wait
    the host's 60 s before its own child even started)."""
    text = str(request.get("env", {}).get(TIMEOUT_ENV, ""))
    try:
        asked = float(text)
    except ValueError:
        return PROBE_LIMIT_S
    return min(PROBE_LIMIT_S, asked) if asked > 0 else PROBE_LIMIT_S


def _imports_cleanly(name: str, limit: float | None = None) -> bool | None:
    """Whether a forked probe imports ``name`` within ``limit`` (None: it did not end in
    time) and returns from the import (its own exit code, so a library that exits 0 at
    import does not pass): only then does the host import it itself. (Threads are not
    counted: a numerical library's BLAS pool starts at import, as numpy's and torch's own do
    in the host.)"""
    try:
        pid = os.fork()
    except OSError:
        return False
    if pid == 0:  # the probe: its own group, none of the host's fds, its output discarded
        code = 1
        try:
            if not leave_host():
                os._exit(1)
            become_subreaper()  # a daemon the library starts at import stays ours, and ends
            nothing = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(nothing, fd)
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))
            importlib.import_module(name)
            code = IMPORTED
        finally:
            with contextlib.suppress(BaseException):
                kill_descendants(os.getpid())
            os._exit(code)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)
    deadline = time.monotonic() + (PROBE_LIMIT_S if limit is None else limit)
    while time.monotonic() < deadline:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored): no verdict to read
            return False
        if done:
            return os.waitstatus_to_exitcode(status) == IMPORTED
        time.sleep(0.01)
    kill_group(pid)
    for _ in range(100):  # a probe stuck in the kernel (a dead mount) is left to _reap
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
        time.sleep(0.01)
    return None  # no verdict within the limit: a hang, or merely slower than it
