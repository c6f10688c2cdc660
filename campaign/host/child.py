"""What a child of the task host does between the fork and its work.

It leads its own process group, dies with the host (which dies with its
owner), takes back the default action of the signals the host ignores,
closes the host's channels, keeps its own socket to the host (so it can ask
for children of its own: the replay check of a run, the pilot's fresh-process
checks), takes the requester's working directory, environment and import path,
and then either calls a function (``call``: its JSON result or error in the
request's result file) or runs a module as ``__main__`` (``module``, as
``python -m`` would).

Why a child of the clean host is as fresh as a new interpreter for the checks
that need one: it is forked from a process that imported modules and did
nothing else: it ran no model, drew no random number, touched no CUDA, and
shares no memory with the process that trained or saved what it checks. Only
what that process wrote to disk can make its answer right.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from campaign.errors import exit_code_of
from campaign.host import client
from campaign.host.client import THREAD_VARIABLES
from campaign.host.processes import (
    HOST_SIGNALS,
    become_subreaper,
    follow,
    kill_descendants,
    leave_host,
)


def become(request: dict[str, Any], connection: int, host_fds: Sequence[int],
           default_threads: int | None = None) -> NoReturn:
    """The child from the fork to ``os._exit``: it never returns into the host's loop."""
    code = 1
    try:
        if not leave_host():
            os._exit(1)
        become_subreaper()  # a daemon its task code forks (setsid) stays its descendant
        for signum in HOST_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        # No signal blocked: a parent may block some (a Ray worker blocks SIGINT), and a mask
        # is inherited through fork and exec; the run must receive what its supervisor sends.
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        _standard_streams(request)
        for fd in host_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        client.adopt(connection)
        _title(request.get("title"))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _threads_as_a_new_interpreter(default_threads)
        if request.get("follow"):
            follow(int(request["follow"]), stop_with_it=bool(request.get("stop_with")))
        code = _run_module(request) if request["kind"] == "module" else _call(request)
    except BaseException:
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        with contextlib.suppress(BaseException):  # nothing it started outlives it (a daemon
            kill_descendants(os.getpid())  # a task module forked at import outlived `plan`)
        os._exit(code)


def _threads_as_a_new_interpreter(default: int | None) -> None:
    """torch's intra-op threads as a new interpreter would set them from this environment
    (OMP_NUM_THREADS, else MKL_NUM_THREADS, else torch's default, which the host read with
    neither set): the host imported torch under its owner's settings, not the request's."""
    torch = sys.modules.get("torch")
    if torch is None or default is None:
        return
    wanted = default
    for name in THREAD_VARIABLES:
        text = os.environ.get(name, "")
        if text.strip().isdigit() and int(text) > 0:
            wanted = int(text)
            break
    if torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)


def _standard_streams(request: dict[str, Any]) -> None:
    """stdin from /dev/null; stdout and stderr to the request's files (or both appended to its
    ``log``), else both to the host's stderr (the owner's): a child's prints never reach an
    answer channel or a command's stdout."""
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)
    os.close(nothing)
    if request.get("log"):  # both streams appended to a run's log (its replay's prints)
        opened = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(opened, 2)
        os.close(opened)
    for fd, key in ((2, "stderr"), (1, "stdout")):
        path = request.get(key)
        if path:
            opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        elif fd == 1:
            os.dup2(2, 1)
    sys.stdout = open(1, "w", closefd=False, buffering=1)  # noqa: SIM115 - the child's own
    sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115


def _title(title: str | None) -> None:
    """What ``ps`` and ``top`` show for this child: its run or its call, not the host's
    ``python -m campaign.host.host_process`` that every child would otherwise repeat."""
    if not title:
        return
    with contextlib.suppress(Exception):  # a title is a courtesy, never a failure
        import setproctitle

        setproctitle.setproctitle(title)


def _run_module(request: dict[str, Any]) -> int:
    import runpy

    cwd = request["cwd"]
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [cwd, *extra, *sys.path[1:]]  # as `python -m` would have it
    sys.argv = [request["module"], *request.get("argv", ())]
    # The host may have imported the module (its dependencies are what it preloads for); as
    # `python -m` it runs afresh as __main__, and runpy must not find it imported already.
    sys.modules.pop(request["module"], None)
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as done:
        if isinstance(done.code, int) or done.code is None:
            return done.code or 0
        print(done.code, file=sys.stderr)
        return 1
    return 0


def _call(request: dict[str, Any]) -> int:
    """``module:function(*args)``; the value or the error (one line) in the result file."""
    if request.get("path"):
        sys.path[:] = list(request["path"])
    result = Path(request["result"]) if request.get("result") else None
    code = 0
    try:
        module, _, name = request["target"].partition(":")
        function: Any = importlib.import_module(module)
        for part in name.split("."):
            function = getattr(function, part)
        answer: dict[str, Any] = {"value": function(*request.get("args", ()))}
    except BaseException as error:  # reported to the caller as one line, never a traceback
        answer, code = {"error": describe_error(error)}, 1
        if request.get("traceback"):
            import traceback

            traceback.print_exc()
    if result is not None:
        temporary = result.with_suffix(".partial")
        temporary.write_text(json.dumps(answer, default=str))
        os.replace(temporary, result)
    return code


def describe_error(error: BaseException) -> dict[str, Any]:
    """An error as the caller re-raises it: its class, its exit code when it is a project error
    (docs/cli.md, exit codes), its first line, an exit's status."""
    text = str(error)
    return {"module": type(error).__module__, "name": type(error).__qualname__,
            "exit_code": exit_code_of(error),
            "message": text.splitlines()[0] if text.strip() else "",
            "exit": error.code if isinstance(error, SystemExit) else None}
