"""Task code in a child of the task host, with one time limit and one way to end.

Three kinds of work go through here:

- :func:`call` runs ``function(*args)`` (module level, JSON in and out) for a
  command: the plan-time contract check and training-set size, ``inspect``,
  ``order``, the pilot, a replay. It must return within
  ``CAMPAIGN_TASK_TIMEOUT_S`` seconds (default 300; the pilot and replays pass
  their own); a task that hangs (at import too), calls ``sys.exit`` or
  ``os._exit``, or raises ends as one clear error, and a project error (a bad
  spec, a ledger refusal) keeps its exit code.
- :func:`run_module` runs ``python -m MODULE ARGS`` in a fresh child and reads
  its one JSON answer (:func:`answer`): the pilot's fresh-process resume check
  and the replay of a final artifact.
- :func:`start` starts a child the caller watches itself (a run, watched by
  its supervisor).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Container, Mapping, Sequence
from pathlib import Path
from typing import Any

from campaign import errors
from campaign.errors import HostedError, TaskContractError
from campaign.host import client
from campaign.host.client import Child, HostError
from campaign.host.processes import TIMEOUT_ENV, ended_how

# What a fresh check (the pilot's resume check, a replay) needs beyond its own module, which the
# host imports anyway: it builds an optimizer or loads weights.
CHECK_PRELOAD = ("torch._dynamo", "safetensors.torch")
ANSWER_VARIABLE = "CAMPAIGN_ANSWER_FILE"  # where a fresh child writes its JSON answer
DEFAULT_TIMEOUT_S = 300.0


class FreshProcessFailed(Exception):
    """A fresh child exited with an error (its last stderr line is the message)."""


def target_of(function: Callable[..., Any]) -> str:
    """``module:qualified.name`` of a module-level function (what a child imports)."""
    return f"{function.__module__}:{function.__qualname__}"


def start(function: Callable[..., Any], args: Sequence[Any], *, follow: int | None = None,
          stop_with: bool = False, result: Path | None = None, task: str | None = None,
          env: Mapping[str, str] | None = None, preload: Sequence[str] = (),
          title: str | None = None, log: Path | None = None) -> Child:
    """A child that calls ``function(*args)``, started now; the caller watches it. ``preload``:
    modules the host imports once before it forks (inherited by every later child); ``task``:
    the task reference, whose declared preloads the host imports the same way; ``title``:
    what ``ps`` shows for it (a run's id), else what it calls."""
    request = {"kind": "call", "target": target_of(function), "args": list(args),
               "cwd": os.getcwd(),
               "env": dict(os.environ if env is None else env), "path": list(sys.path),
               "result": str(result) if result else None, "follow": follow,
               "stop_with": stop_with, "task": task, "preload": list(preload),
               "title": title or f"campaign: {target_of(function)}",
               "log": str(log) if log else None}
    return client.current().start(request)


def call(function: Callable[..., Any], *args: Any, what: str,
         timeout_s: float | None = None, task: str | None = None,
         preload: Sequence[str] = ()) -> Any:
    """``function(*args)`` in a guarded child; its JSON-able value, or its error raised here.
    ``function``: a module-level function the child imports by its module and name. A caller
    that must not import torch (the command line) names a function of a torch-free entry
    module (``loop/loop_entries.py``, ``pilot/pilot_entries.py``)."""
    return begin(function, *args, what=what, timeout_s=timeout_s, task=task,
                 preload=preload).result()


def begin(function: Callable[..., Any], *args: Any, what: str,
          timeout_s: float | None = None, task: str | None = None,
          preload: Sequence[str] = (), log: Path | None = None) -> Pending:
    """:func:`call` started now, answered by :meth:`Pending.result` (the caller works on
    meanwhile: a second core imports the user's task while the host imports torch's rest).
    ``log``: a file the child's output is appended to (a run's replay: the run's log)."""
    limit = timeout() if timeout_s is None else timeout_s
    folder = tempfile.TemporaryDirectory(prefix="campaign-call-")
    result = Path(folder.name) / "result.json"
    try:
        child = _started(lambda: start(function, args, follow=os.getpid(), result=result,
                                       task=task, preload=preload, title=f"campaign: {what}",
                                       log=log))
    except BaseException:
        folder.cleanup()
        raise
    return Pending(child, folder, result, what, time.monotonic() + limit, limit)


class Pending:
    """A guarded call under way: its child, and where its answer will be."""

    def __init__(self, child: Child, folder: tempfile.TemporaryDirectory[str], result: Path,
                 what: str, deadline: float, limit: float) -> None:
        self.child, self.folder, self.path = child, folder, result
        self.what, self.deadline, self.limit = what, deadline, limit
        self.timed_out = False  # it ran past its limit and was killed here

    def result(self) -> Any:
        """The call's value, or its error raised here (the child is gone either way)."""
        try:
            self.timed_out = self.child.join(max(0.0, self.deadline - time.monotonic())) is None
        finally:  # Ctrl-C or SIGTERM here must not leave the task's process behind
            self.cancel()
        try:
            if self.timed_out:
                raise TaskContractError(f"task code did not return within {self.limit:g} s "
                                        f"while {self.what} ({TIMEOUT_ENV} sets the limit)")
            try:
                answer_ = json.loads(self.path.read_text())
            except (OSError, ValueError):
                how = ended_how(self.child.exitcode)
                raise TaskContractError(f"task code ended its process ({how}) while "
                                        f"{self.what}") from None
        finally:
            self.folder.cleanup()
        if "value" in answer_:
            return answer_["value"]
        raise _error(answer_["error"], self.what)

    def cancel(self) -> None:
        """Kill the child (and what it forked) and wait for its end."""
        self.child.kill()
        self.child.join()


def with_torch(function: Callable[..., Any], *args: Any, what: str, task: str | None = None,
               preload: Sequence[str] = ()) -> Any:
    """``function(*args)`` where torch is: in this process when it has torch already (a run,
    the pilot, a test), else in a guarded child of the task host (a command, a worker, the
    launcher: they import no torch). For checks that ask torch (the stack, a device, an
    optimizer's signature); JSON values in and out."""
    if "torch" in sys.modules:
        return function(*args)
    return call(function, *args, what=what, task=task, preload=preload)


def _error(error: Mapping[str, Any], what: str) -> Exception:
    if error.get("exit") is not None or error["name"] == "SystemExit":
        return TaskContractError(f"task code raised {error['name']}({error['exit']}) while {what}")
    if error["module"] == errors.__name__ and error["name"] != HostedError.__name__:
        return getattr(errors, error["name"])(error["message"])  # the callers' own refusals
    if error.get("exit_code") is not None:  # a project error of a class only the child knows
        return HostedError(error["message"], error["exit_code"])
    return TaskContractError(f"task code failed while {what}: {error['name']}: {error['message']}")


def timeout() -> float:
    """The time limit of a guarded call (``CAMPAIGN_TASK_TIMEOUT_S``), checked."""
    text = os.environ.get(TIMEOUT_ENV)
    try:
        value = DEFAULT_TIMEOUT_S if text is None else float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise TaskContractError(f"{TIMEOUT_ENV}={text!r}: expected a positive number of seconds")
    return value


def run_module(
    arguments: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 600,
    answers_with: Container[int] = (0,),
    task: str | None = None,
    preload: Sequence[str] = (),
) -> Any:
    """``python -m MODULE ARGS`` (``arguments`` = ["-m", MODULE, *ARGS]) in a fresh child, in
    the current directory; its answer (:func:`answer`, else stdout) parsed as one JSON
    document. ``answers_with``: the exit codes after which it answered (a check that fails may
    still answer). ``task``: the task reference; its declared preloads (transformers,
    seconds) are imported once in the host, so later checks start without them."""
    if arguments[:1] != ["-m"] or len(arguments) < 2:
        raise ValueError("run_module runs a module: arguments start with -m MODULE")
    environment = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory(prefix="campaign-answer-") as folder:
        answer_path, out, err = (Path(folder) / n for n in ("answer.json", "stdout", "stderr"))
        environment[ANSWER_VARIABLE] = str(answer_path)
        request = {"kind": "module", "module": arguments[1], "argv": list(arguments[2:]),
                   "cwd": os.getcwd(), "env": environment, "stdout": str(out),
                   "stderr": str(err), "follow": os.getpid(), "task": task,
                   "preload": [*CHECK_PRELOAD, *preload],
                   "title": f"campaign: python -m {' '.join(arguments[1:])}"}
        child = _started(lambda: client.current().start(request), fresh=True)
        try:
            returncode = child.join(timeout_s)
        finally:
            child.kill()
            child.join()
        if returncode is None:
            raise FreshProcessFailed(f"the fresh process gave no answer within {timeout_s:g} s")
        written = answer_path.read_text() if answer_path.exists() else None
        stdout = out.read_text(errors="replace") if out.exists() else ""
        stderr = err.read_text(errors="replace") if err.exists() else ""
    if returncode not in answers_with:
        lines = stderr.strip().splitlines()
        raise FreshProcessFailed(lines[-1] if lines else f"exit status {returncode}")
    try:  # the answer channel; stdout only for modules that do not use it
        return json.loads(written if written is not None else stdout)
    except json.JSONDecodeError as error:
        raise FreshProcessFailed(f"no JSON answer ({error})") from None


def answer(document: Any) -> bool:
    """Give ``document`` to the process that asked (:func:`run_module`) through its own file,
    never through stdout, where a task's prints would corrupt it. False when nobody asked."""
    path = os.environ.get(ANSWER_VARIABLE)
    if not path:
        return False
    Path(path).write_text(json.dumps(document, default=str))
    return True


def _started(begin: Callable[[], Child], *, fresh: bool = False) -> Child:
    try:
        return begin()
    except HostError as error:
        if fresh:
            raise FreshProcessFailed(str(error)) from None
        raise TaskContractError(f"the task host could not start task code: {error}") from None
