"""Run a module in a fresh process and read its one JSON answer.

A fresh process is the proof the pilot and the replay rely on: whatever the
training process holds in memory (weights, caches, RNG states, patched
modules) is not there, so only what was written to disk can make the answer
right.

Starting an interpreter and importing torch costs seconds, paid again for every
replay of every run. So the checks run in processes forked from a *preloaded
interpreter*: a server process started once (per process that asks), which
imports torch and our loop modules and then only forks. A forked child shares
none of the asking process's state; it starts from the server's, which has run
no model, drawn no random number and never touched CUDA (forking before CUDA
is initialised is safe). Requests and answers are JSON lines; nothing is
pickled. ``CAMPAIGN_FRESH_PROCESS=spawn`` starts a new interpreter every time
instead.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Container, Mapping, Sequence
from pathlib import Path
from typing import Any

ANSWER_VARIABLE = "CAMPAIGN_ANSWER_FILE"  # where a fresh process writes its JSON answer
MODE_VARIABLE = "CAMPAIGN_FRESH_PROCESS"
# What the checks import (never the modules they run: runpy wants to execute those afresh).
PRELOAD = ("torch", "numpy", "safetensors.torch", "campaign.loop.engine", "campaign.cli")


class FreshProcessFailed(Exception):
    """The fresh process exited with an error (its last stderr line is the message)."""


def run_json(
    arguments: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 600,
    answers_with: Container[int] = (0,),
    preload: Sequence[str] = (),
) -> Any:
    """``python -m MODULE ARGS`` (``arguments`` = ["-m", MODULE, *ARGS]) in a fresh process, in
    the current directory; its stdout parsed as one JSON document. ``answers_with``: the exit
    codes after which stdout holds the answer (a check that fails may still answer).
    ``preload``: modules the preloaded interpreter imports once before it forks (a built-in
    task's transformers, seconds a process), so later checks of that task start without them."""
    if arguments[:1] != ["-m"] or len(arguments) < 2:
        raise ValueError("run_json runs a module: arguments start with -m MODULE")
    environment = dict(env if env is not None else os.environ)
    with tempfile.TemporaryDirectory(prefix="campaign-answer-") as folder:
        answer_path = Path(folder) / "answer.json"
        environment[ANSWER_VARIABLE] = str(answer_path)
        if os.environ.get(MODE_VARIABLE) == "spawn":
            returncode, stdout, stderr = _spawn(arguments, environment, timeout_s)
        else:
            returncode, stdout, stderr = _preloaded().run(arguments, environment, timeout_s,
                                                          preload)  # fmt: skip
        written = answer_path.read_text() if answer_path.exists() else None
    if returncode not in answers_with:
        lines = stderr.strip().splitlines()
        raise FreshProcessFailed(lines[-1] if lines else f"exit status {returncode}")
    try:  # the answer channel; stdout only for modules that do not use it
        return json.loads(written if written is not None else stdout)
    except json.JSONDecodeError as error:
        raise FreshProcessFailed(f"no JSON answer ({error})") from None


def answer(document: Any) -> bool:
    """Give ``document`` to the process that asked (:func:`run_json`) through its own file,
    never through stdout, where a task's prints would corrupt it. False when nobody asked."""
    path = os.environ.get(ANSWER_VARIABLE)
    if not path:
        return False
    Path(path).write_text(json.dumps(document, default=str))
    return True


def _spawn(arguments: Sequence[str], env: dict[str, str], timeout_s: float) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, *arguments], capture_output=True, text=True, timeout=timeout_s,
        cwd=os.getcwd(), env=env,
    )  # fmt: skip
    return done.returncode, done.stdout, done.stderr


class PreloadedInterpreter:
    """The client side: one server process, asked one request at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server: subprocess.Popen[str] | None = None

    def run(self, arguments: Sequence[str], env: dict[str, str], timeout_s: float,
            preload: Sequence[str] = ()) -> tuple[int, str, str]:  # fmt: skip
        request = {"module": arguments[1], "args": list(arguments[2:]), "cwd": os.getcwd(),
                   "env": env, "preload": list(preload)}  # fmt: skip
        with self._lock:
            server = self._running()
            assert server.stdin is not None and server.stdout is not None
            try:
                server.stdin.write(json.dumps(request) + "\n")
                server.stdin.flush()
                ready, _, _ = select.select([server.stdout], [], [], timeout_s)
                line = server.stdout.readline() if ready else ""
            except (BrokenPipeError, OSError):
                line = ""
            except BaseException:  # interrupted mid-request: its answer must not be read later
                self.close()
                raise
            if not line:  # timed out or died: nothing of it may linger
                ended = server.poll()
                self.close()
                if ended is not None:
                    raise FreshProcessFailed(f"the preloaded interpreter exited ({ended})")
                raise FreshProcessFailed(f"the fresh process gave no answer within {timeout_s:g} s")
        answer = json.loads(line)
        return int(answer["returncode"]), answer["stdout"], answer["stderr"]

    def _running(self) -> subprocess.Popen[str]:
        if self._server is None or self._server.poll() is not None:
            self._server = subprocess.Popen(
                [sys.executable, "-m", "campaign.loop.fresh_process", "--serve"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True, start_new_session=True,  # its own process group: closed as a whole
            )  # fmt: skip
        return self._server

    def close(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        with contextlib.suppress(OSError):
            if server.stdin is not None:
                server.stdin.close()  # end of requests: the server exits
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait()


_INTERPRETERS: dict[int, PreloadedInterpreter] = {}


def _preloaded() -> PreloadedInterpreter:
    """This process's server (a forked copy of a process starts its own)."""
    pid = os.getpid()
    if pid not in _INTERPRETERS:
        _INTERPRETERS[pid] = interpreter = PreloadedInterpreter()
        atexit.register(interpreter.close)
    return _INTERPRETERS[pid]


# -- the server ---------------------------------------------------------------------------


def serve() -> None:
    """Import what every check needs, then fork one child per request line until EOF."""
    for module in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(module)
    answers = sys.stdout
    sys.stdout = sys.stderr  # nothing but answers on the answer channel
    for line in sys.stdin:
        request = json.loads(line)
        for module in request.get("preload", ()):  # imported once, inherited by later forks
            with contextlib.suppress(ImportError):
                __import__(module)
        answers.write(json.dumps(_fork(request)) + "\n")
        answers.flush()


def _fork(request: Mapping[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        pid = os.fork()
        if pid == 0:  # the child: becomes `python -m MODULE ARGS` in the asker's directory
            _child(request, out, err)
        _, status = os.waitpid(pid, 0)
        return {"returncode": os.waitstatus_to_exitcode(status),
                "stdout": out.read_text(errors="replace") if out.exists() else "",
                "stderr": err.read_text(errors="replace") if err.exists() else ""}  # fmt: skip


def _child(request: Mapping[str, Any], out: Path, err: Path) -> None:
    code = 1
    try:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the request channel is not the child's
        for stream, path in ((1, out), (2, err)):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(descriptor, stream)
            os.close(descriptor)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - lives as long as the child
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [request["cwd"], *extra, *sys.path[1:]]  # as `python -m` would have it
        sys.argv = [request["module"], *request["args"]]
        import runpy

        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if not isinstance(done.code, int | None):
            print(done.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    serve()
