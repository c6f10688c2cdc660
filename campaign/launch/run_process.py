"""The run's own process, a child of the task host, as the supervisor
(:mod:`campaign.launch.supervisor`) starts it.

The host child's bootstrap (:mod:`campaign.host.child`) gives it its own
process group (anything the task forks dies with it), the caller's
environment and working directory, stdin from ``/dev/null``, death with the
host and a follower of its supervisor (it dies when the supervisor dies and
stops while the supervisor is stopped, until the supervisor continues it).
Here it sends its output to the run's log file, opens the ledger, ticks its
progress page and runs the body. What it ends with is written to a small JSON
file the supervisor reads: the outcome, a lost lease, or the error.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import signal
import sys
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

from campaign.errors import LeaseLost, LedgerUnreachable
from campaign.host.processes import kill_descendants
from campaign.ledger import Ledger
from campaign.loop import progress_page
from campaign.loop.signals import WALL_TIME_SIGNAL

CHILD_FAILED = 70  # the exit code when the run's body raised (EX_SOFTWARE)
ARTIFACTS_ENV = "CAMPAIGN_ARTIFACTS"  # the run's artifacts folder, for task code
SUPERVISOR_ENV = "CAMPAIGN_SUPERVISOR_PID"  # in the run's process: its supervisor's id


@dataclass(frozen=True)
class ChildJob:
    """What the run's process needs, sent to it through the host's request channel as JSON,
    never on argv: the ledger's URL with its password, the body (``module:function`` called
    as ``function(*args, ledger, log)``), and where to write."""

    url: str
    body: str
    args: list[Any]
    log: str
    board: str
    result: str

    def document(self) -> dict[str, Any]:
        return asdict(self)


def run_child(job: dict[str, Any]) -> NoReturn:
    """The run's process from start to ``os._exit`` (it never returns into its caller)."""
    code, answer = 0, {}
    result = Path(job["result"])
    try:
        for signum in (signal.SIGTERM, signal.SIGINT, WALL_TIME_SIGNAL):
            signal.signal(signum, signal.SIG_DFL)
        _redirect(Path(job["log"]))
        progress_page.install(progress_page.ProgressBoard(Path(job["board"])))
        module, _, name = job["body"].partition(":")
        body = getattr(importlib.import_module(module), name)
        with Ledger.open(job["url"], patient=True) as ledger:  # a held lock is waited out
            outcome = body(*job["args"], ledger, Path(job["log"]))
            answer = {"outcome": asdict(outcome)}
    except LeaseLost as error:
        answer = {"lease_lost": str(error)}
    except BaseException as error:  # the supervisor records it as the run's end
        with contextlib.suppress(BaseException):
            traceback.print_exc()
        answer, code = {"error": f"{type(error).__name__}: {error}"[:2000]}, CHILD_FAILED
        # A ledger that stayed locked (or away) even for the run's end: nothing is lost but the
        # updates since its last checkpoint, so the supervisor ends it resumable.
        answer["resumable"] = isinstance(error, LedgerUnreachable)
    try:
        temporary = result.with_suffix(".partial")
        temporary.write_text(json.dumps(answer, default=str))
        os.replace(temporary, result)
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
    finally:
        kill_descendants(os.getpid())  # nothing the run started outlives it
        os._exit(code)


def _redirect(log: Path) -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    # Python's own streams onto the new descriptors (a caller may have replaced them).
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
