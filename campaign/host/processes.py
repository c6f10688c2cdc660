"""Process groups, liveness and the words for how a child ended (no torch here).

Every child of the task host is the leader of its own process group, so a
kill reaches what its task forked too, and a follower thread makes a child
die (or stop) with the process it serves.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import threading
import time

# What a scheduler sends and the host ignores (only the supervisor interprets them), and the
# child-ended signal the host's loop wakes on: a child takes back their default actions, a
# preload may not change them in the host.
SCHEDULER_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
                     signal.SIGUSR2)
HOST_SIGNALS = (*SCHEDULER_SIGNALS, signal.SIGCHLD)
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

TIMEOUT_ENV = "CAMPAIGN_TASK_TIMEOUT_S"  # a guarded call's time limit (host.calls)


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (PR_SET_CHILD_SUBREAPER): a
    daemon the task forks (``setsid`` and a double fork leave the process group) is
    reparented here instead of to init, so :func:`kill_descendants` still finds it."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    return False


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, whatever its session or group (from /proc)."""
    found: list[int] = []
    queue = [pid]
    while queue:
        current = queue.pop()
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    children = [int(c) for c in handle.read().split()]
                found += children
                queue += children
    return found


def kill_descendants(pid: int) -> None:
    """SIGKILL every descendant of ``pid`` (the process itself is left alone)."""
    for child in descendants(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)


def kill_group(pid: int | None, *, ended: bool = False) -> None:
    """SIGKILL the process group led by ``pid``: a host child and whatever it forked (a
    loader's workers, a task's subprocess), which may outlive the leader. The process alone
    while it does not lead a group yet, unless it is known ``ended`` (its pid may belong to
    another process by now; a group id stays reserved while any member lives)."""
    if pid is None:
        return
    if not ended:  # a descendant that left the group (setsid) is still one of its tree
        kill_descendants(pid)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        if not ended:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def die_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies (PR_SET_PDEATHSIG). False
    when the parent was already gone (reparented) or the call is not available."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    return os.getppid() == parent


def leave_host() -> bool:
    """The first steps of any process the host forks (a child, a preload's probe): lead its
    own process group, die with the host, and stop writing to the host's wake-up pipe. False
    when the host is gone already (the caller then exits)."""
    os.setpgid(0, 0)
    if not die_with_parent():
        return False
    signal.set_wakeup_fd(-1)
    return True


def follow(parent: int, *, stop_with_it: bool) -> None:
    """In a child: a thread that kills this process group when ``parent`` is gone (or dead and
    not yet reaped), and, with ``stop_with_it``, stops this process while ``parent`` is stopped
    (its parent continues it). A caller killed without running its cleanup (SIGTERM's default
    action) then leaves nothing behind."""

    def watch() -> None:
        while True:
            state = process_state(parent)
            if state is None or state in ("Z", "X"):
                kill_descendants(os.getpid())
                os.killpg(0, signal.SIGKILL)
            # stopped (not traced: a debugger's pause is not the parent's); looked at twice, so
            # a parent continued in between is not followed into a stop nobody would end
            if stop_with_it and state == "T" and process_state(parent) == "T":
                os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(0.2)

    threading.Thread(target=watch, name="follow-parent", daemon=True).start()


# Signals a process raises on itself when its own code crashes: its failure, not a kill.
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE,
                           signal.SIGABRT, signal.SIGSYS, signal.SIGTRAP})


def killed_from_outside(exitcode: int | None, host_gone: bool = False) -> bool:
    """True when a child ended by a signal from outside it (or with its host), not by its own
    crash (SIGSEGV and the like) nor by an exit."""
    return host_gone or (exitcode is not None and exitcode < 0
                         and -exitcode not in CRASH_SIGNALS)


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


def parent_pid(pid: int) -> int | None:
    """The parent of process ``pid`` (a host's child: its task host), None when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return int(handle.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


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
