"""The run's own process, as the supervisor (:mod:`campaign.launch.supervisor`) starts it.

It gets its own process group (so anything the task forks dies with it), the
caller's environment and working directory, stdin from ``/dev/null`` and its
stdout/stderr in the run's log file, a fresh connection to the ledger, and the
progress page it ticks. It follows its supervisor: it dies when the supervisor
dies (at once when the supervisor forked it, by ``PR_SET_PDEATHSIG``; else
within 0.2 s) and stops while the supervisor is stopped (SIGSTOP, a paused VM),
until the supervisor continues it. What it ends with is written to a small
JSON file the supervisor reads: the outcome, a lost lease, or the error.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import io
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn

from campaign.ledger import Ledger
from campaign.ledger.errors import LeaseLost
from campaign.loop import progress
from campaign.loop.forkserver import follow
from campaign.loop.signals import WALL_TIME_SIGNAL
from campaign.loop.train import RunOutcome

CHILD_FAILED = 70  # the exit code when the run's body raised (EX_SOFTWARE)
PR_SET_PDEATHSIG = 1
ARTIFACTS_ENV = "CAMPAIGN_ARTIFACTS"  # the run's artifacts folder, for task code
SUPERVISOR_ENV = "CAMPAIGN_SUPERVISOR_PID"  # in the run's process: its supervisor's id
# A supervisor that forks directly leaves its ledger here for the child: the same engine
# (its compiled statements) with a pool of its own, instead of a new one per run.
inherited: list[Ledger] = []


@dataclass(frozen=True)
class ChildJob:
    """What the run's process needs, sent to it by the fork (or through the fork server),
    never on argv: the ledger's URL with its password, the run, and where to write."""

    url: str
    run: Callable[[Ledger, Path], RunOutcome]
    log: Path
    board: Path
    result: Path
    cwd: str
    environment: dict[str, str]


def run_child(job: ChildJob) -> NoReturn:
    """The run's process from start to ``os._exit`` (it never returns into its caller)."""
    code, answer = 0, {}
    try:
        os.setpgid(0, 0)
        for signum in (signal.SIGTERM, signal.SIGINT, WALL_TIME_SIGNAL):
            signal.signal(signum, signal.SIG_DFL)
        _die_with(int(job.environment[SUPERVISOR_ENV]))
        os.environ.clear()
        os.environ.update(job.environment)
        os.chdir(job.cwd)
        _redirect(job.log)
        progress.install(progress.ProgressBoard(job.board))
        if inherited:  # a fork of the supervisor: its engine, none of its connections
            ledger = inherited[0]
            ledger.engine.dispose(close=False)
            answer = {"outcome": asdict(job.run(ledger, job.log))}
        else:
            with Ledger.open(job.url) as ledger:
                answer = {"outcome": asdict(job.run(ledger, job.log))}
    except LeaseLost as error:
        answer = {"lease_lost": str(error)}
    except BaseException as error:  # the supervisor records it as the run's end
        with contextlib.suppress(BaseException):
            traceback.print_exc()
        answer, code = {"error": f"{type(error).__name__}: {error}"[:2000]}, CHILD_FAILED
    try:
        temporary = job.result.with_suffix(".partial")
        temporary.write_text(json.dumps(answer, default=str))
        os.replace(temporary, job.result)
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
    finally:
        os._exit(code)


def _die_with(supervisor: int) -> None:
    if os.getppid() == supervisor:  # forked by the supervisor itself: the kernel's own rule
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != supervisor:  # it died before the prctl took effect
            os._exit(CHILD_FAILED)

    follow(supervisor, stop_with_it=True)


def _redirect(log: Path) -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    os.close(nothing)
    # Python's own streams onto the new descriptors (a caller may have replaced them).
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
