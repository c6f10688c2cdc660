"""Task code at plan time and in ``inspect``, in a child process under a time limit.

Planning builds the task (the contract check) and asks it for its training-set
size; ``inspect`` reads examples through it. Before, a factory that called
``sys.exit(0)`` made ``plan --dry-run`` exit 0 printing nothing, a hang in
``splits()`` blocked the command for ever, and a task that printed put text
before ``plan --format json``'s document. Here the call runs in a process
forked from the fork server (:mod:`campaign.loop.forkserver`) with its stdout
sent to stderr; it must return within ``CAMPAIGN_TASK_TIMEOUT_S`` seconds
(default 300), and whatever it does ends as one clear error.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from campaign.loop.errors import TaskContractError
from campaign.loop.forkserver import ended_how, follow, fork_context, kill_group, start

TIMEOUT_ENV = "CAMPAIGN_TASK_TIMEOUT_S"
CALLER_ENV = "CAMPAIGN_GUARDED_CALLER"
DEFAULT_TIMEOUT_S = 300.0
# Errors a guarded call may raise as themselves (by class path): the callers' own refusals.
PASSED_ON = {
    ("campaign.loop.errors", "TaskContractError"),
    ("campaign.ledger.errors", "LedgerInputError"),
}


def call(function: Callable[..., Any], *args: Any, what: str) -> Any:
    """``function(*args)`` (module level, JSON-able result) in a guarded child process."""
    timeout_s = _timeout()
    with tempfile.TemporaryDirectory(prefix="campaign-guarded-") as folder:
        result = Path(folder) / "result.json"
        child = fork_context().Process(
            target=_child, args=(function, args, result, os.getcwd(),
                                 {**os.environ, CALLER_ENV: str(os.getpid())}),
            name="campaign-task-code",
        )  # fmt: skip
        try:
            start(child)
            child.join(timeout_s)
            timed_out = child.exitcode is None
        finally:  # Ctrl-C or SIGTERM here must not leave the task's process behind
            if child.pid is not None:
                kill_group(child)  # the child and what it forked
                child.join()
        if timed_out:
            raise TaskContractError(f"task code did not return within {timeout_s:g} s while "
                                    f"{what} ({TIMEOUT_ENV} sets the limit)")  # fmt: skip
        try:
            answer = json.loads(result.read_text())
        except (OSError, ValueError):
            how = ended_how(child.exitcode)
            raise TaskContractError(f"task code ended its process ({how}) while {what}") from None
    if "value" in answer:
        return answer["value"]
    error = answer["error"]
    if error.get("exit") is not None:
        raise TaskContractError(f"task code raised {error['name']}({error['exit']}) while {what}")
    if (error["module"], error["name"]) in PASSED_ON:
        module = __import__(error["module"], fromlist=[error["name"]])
        raise getattr(module, error["name"])(error["message"])
    raise TaskContractError(f"task code failed while {what}: {error['name']}: {error['message']}")


def _timeout() -> float:
    text = os.environ.get(TIMEOUT_ENV)
    try:
        value = DEFAULT_TIMEOUT_S if text is None else float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise TaskContractError(f"{TIMEOUT_ENV}={text!r}: expected a positive number of seconds")
    return value


def _child(function: Callable[..., Any], args: tuple[Any, ...], result: Path, cwd: str,
           environment: dict[str, str]) -> NoReturn:  # fmt: skip
    code = 0
    try:
        os.setpgid(0, 0)
        follow(int(environment[CALLER_ENV]), stop_with_it=False)  # a killed caller: we go too
        os.environ.clear()
        os.environ.update(environment)
        os.chdir(cwd)
        os.dup2(2, 1)  # what the task prints goes to stderr: a command's stdout stays its own
        answer: dict[str, Any] = {"value": function(*args)}
    except BaseException as error:  # reported to the caller as one line, never a traceback
        message = str(error).splitlines()[0] if str(error) else ""
        exit_code = error.code if isinstance(error, SystemExit) else None
        answer = {"error": {"module": type(error).__module__, "name": type(error).__qualname__,
                            "message": message, "exit": exit_code}}  # fmt: skip
        code = 1
    try:
        result.write_text(json.dumps(answer, default=str))
        with contextlib.suppress(BaseException):  # what the task printed, before the exit
            sys.stdout.flush()
            sys.stderr.flush()
    finally:
        os._exit(code)
