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
import sys
import threading
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


def warm_up(*, direct: bool = False) -> None:
    """Before a worker claims a run: with ``direct``, import ``PRELOAD`` in this process (each
    run's fork inherits them); else start the fork server now (its imports take seconds), so
    a run's first heartbeat never waits for it."""
    if direct:
        for name in PRELOAD:
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
