"""Processes for user code, forked from one clean fork server.

Task code runs in a child process whenever it may hang, exit or print: a
run (launch/supervisor.py) and the plan-time and inspect calls
(:mod:`campaign.loop.guarded`). The children are forked from a fork server
started once per process from a fresh interpreter that imported torch and the
loop and never initialised CUDA: a child starts in milliseconds, and never
inherits a lock held by a thread of its caller (a forked copy of a process
whose OpenMP pool or connection pool was busy can hang for ever).
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

# torch._dynamo: the first optimizer a process builds imports it (over a second): done once
# here, not in every run's process.
PRELOAD = ["torch", "torch._dynamo", "pandas", "pyarrow.parquet", "safetensors.torch",
           "campaign.loop.train", "campaign.launch.worker"]  # fmt: skip


def fork_context(*, direct: bool = False) -> Any:
    """The fork-server context (preloading ``PRELOAD`` once in the server). ``direct``: the
    caller is a process made to place runs (``campaign worker``): it imported torch, never
    computed with it nor initialised CUDA, and has no other thread; forking it directly
    saves the fork server's own start (a second torch import) on every worker."""
    if direct and threading.active_count() == 1 and not _cuda_initialised():
        return multiprocessing.get_context("fork")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def start_early() -> None:
    """Start the fork server now, without waiting for it: its imports (torch and the loop,
    seconds) then overlap the caller's own (reading a spec, importing the task to check its
    reference, opening the ledger), and the first guarded call or run finds it ready.
    Starting it spawns a new interpreter (fork + exec), so it is safe from any process."""
    import multiprocessing.forkserver

    fork_context()  # sets what the server preloads
    multiprocessing.forkserver.ensure_running()


def task_preloads(task_reference: str) -> list[str]:
    """What a built-in task declares worth importing once per worker (its ``PRELOAD``: the
    causal-LM task's transformers takes seconds per process). A user's module is never
    imported here: its import-time side effects (a thread) would make forking unsafe."""
    module = task_reference.split(":", 1)[0]
    if not module.startswith("campaign.tasks."):
        return []
    try:
        return list(getattr(importlib.import_module(module), "PRELOAD", ()))
    except ImportError:
        return []


def warm_up(*, direct: bool = False, task_reference: str = "") -> None:
    """Before a worker claims a run: with ``direct``, import ``PRELOAD`` (and the task's own)
    in this process (each run's fork inherits them); else start the fork server now (its
    imports take seconds), so a run's first heartbeat never waits for it."""
    if direct:
        for name in PRELOAD:
            importlib.import_module(name)
        for name in task_preloads(task_reference):  # optional: a run says what is missing
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
        from campaign.stack import PACKAGES, package_version

        for package in PACKAGES:  # read once here, inherited by every run's process
            package_version(package)
        return
    probe = fork_context().Process(target=os.getpid, name="campaign-fork-server-ready")
    start(probe)  # returns once the server has preloaded and forked: it is ready
    probe.join()


def start(process: Any) -> None:
    """Start ``process`` without telling it the caller's ``__main__``: multiprocessing would
    re-run a user's script in the child (or fail on ``python -`` from stdin); our children
    need only importable functions."""
    with _main_module_hidden():
        process.start()


def follow(parent: int, *, stop_with_it: bool) -> None:
    """In a child: a thread that kills this process group when ``parent`` is gone (or dead and
    not yet reaped), and, with ``stop_with_it``, stops this process while ``parent`` is stopped
    (its parent continues it). A caller killed without running its cleanup (SIGTERM's default
    action) then leaves nothing behind."""

    def watch() -> None:
        while True:
            state = process_state(parent)
            if state is None or state in ("Z", "X"):
                os.killpg(0, signal.SIGKILL)
            # stopped (not traced: a debugger's pause is not the parent's); looked at twice, so
            # a parent continued in between is not followed into a stop nobody would end
            if stop_with_it and state == "T" and process_state(parent) == "T":
                os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(0.2)

    threading.Thread(target=watch, name="follow-parent", daemon=True).start()


def kill_group(process: Any) -> None:
    """SIGKILL a started child's process group (it is its own group leader): the child and
    anything its task forked; the child alone while it is not yet the leader."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        if process.exitcode is None:  # never a pid the system may have given to another
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(process.pid, signal.SIGKILL)


def ended_how(exitcode: int | None) -> str:
    """How a child ended, in words: ``was killed by SIGSEGV``, ``exited with status 3``."""
    if exitcode is not None and exitcode < 0:
        return f"was killed by {signal_name(-exitcode)}"
    return f"exited with status {exitcode}"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # a real-time signal without a name
        return f"signal {signum}"


def process_state(pid: int) -> str | None:
    """The one-letter state of process ``pid`` (``R``, ``S``, ``T``...), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0].decode()
    except FileNotFoundError:
        return None
    except (OSError, IndexError):  # no /proc here: liveness only
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return "R"


def _cuda_initialised() -> bool:
    """A process that initialised CUDA must never be forked (its child could not use CUDA)."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main and k in main.__dict__}
    if main is not None:
        main.__dict__.pop("__file__", None)
        main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)
