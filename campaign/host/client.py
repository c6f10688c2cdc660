"""The asking side of the task host: start it once, ask it for children, learn how they end.

A process gets its host from :func:`current`: a child of a host talks to the
host that forked it (through the socket it was given); a process given a host's
address in ``CAMPAIGN_SHARED_HOST`` (a local launch's workers: their launcher's host)
joins that one; any other process spawns its own on first use (``python -m
campaign.host.host_process``), and keeps it until it exits. Every spawned host listens on
an abstract unix socket (no file to leave behind) that accepts only this user's
processes. This module imports no torch: the
command line and the launcher use it and stay light.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from campaign.host.processes import kill_descendants, kill_group

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # what sets torch's intra-op threads
HOST_GONE = -signal.SIGKILL  # the exit code of a child whose host died (it died with it)
SHARED_HOST = "CAMPAIGN_SHARED_HOST"  # a host's address: a local worker joins its launcher's


class HostError(RuntimeError):
    """The host could not start a child, or went away."""


class Child:
    """A started child: its pid, and its exit code once the host reported it."""

    def __init__(self, host: TaskHost, pid: int) -> None:
        self.host = host
        self.pid = pid
        self._exitcode: int | None = None
        self.host_gone = False  # it ended because its host did (its exit code says SIGKILL)

    @property
    def exitcode(self) -> int | None:
        if self._exitcode is None:
            self.host.pump(0)
        return self._exitcode

    def join(self, timeout: float | None = None) -> int | None:
        """Wait until the child ended (or ``timeout`` seconds); its exit code, None if alive."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._exitcode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self.host.pump(0)  # what the host said while the caller was busy counts
                break
            self.host.pump(0.5 if left is None else min(left, 0.5))
        return self._exitcode

    def kill(self) -> None:
        """SIGKILL the child's process group (the child and what it forked)."""
        kill_group(self.pid, ended=self._exitcode is not None)


class TaskHost:
    """One connection to a host: the pipe pair of a host this process spawned, or the socket a
    host gave its child."""

    def __init__(self, read_fd: int, write_fd: int, process: subprocess.Popen[bytes] | None,
                 share_path: str | None = None) -> None:
        self.read_fd, self.write_fd, self.process = read_fd, write_fd, process
        self.share_path = share_path  # where other processes join it (a host this one spawned)
        self.shared = False  # its address was handed out: members may be using it
        self.pid = os.getpid()  # the process this connection belongs to
        self._refs = itertools.count(1)
        self._buffer = b""
        self._waiting: dict[int, dict[str, Any]] = {}  # ref -> the start answer, once read
        self._children: dict[int, Child] = {}  # ref -> child
        self._lock = threading.RLock()
        self.gone = False

    def start(self, request: dict[str, Any]) -> Child:
        """Send one request (:mod:`campaign.host.child` says what it holds); the started
        child once the host forked it."""
        with self._lock:
            if self.gone:
                raise HostError("the task host has exited")
            ref = next(self._refs)
            if SHARED_HOST in request.get("env", {}):  # a child never joins its parent's host
                request = {**request, "env": {k: v for k, v in request["env"].items()
                                              if k != SHARED_HOST}}
            data = (json.dumps({**request, "ref": ref}) + "\n").encode()
            try:
                while data:
                    data = data[os.write(self.write_fd, data):]
            except OSError as error:
                self._lost()
                raise HostError(f"the task host has exited ({error})") from None
            while ref not in self._waiting:
                if self.gone:
                    raise HostError("the task host exited before it started the child")
                self.pump(None)
            answer = self._waiting.pop(ref)
        if "error" in answer:
            raise HostError(answer["error"])
        return answer["child"]  # kept with its answer: its exit may have been read already

    def pump(self, timeout: float | None) -> None:
        """Read what the host said within ``timeout`` seconds (None: until it says something)."""
        with self._lock:
            if self.gone:
                return
            ready, _, _ = select.select([self.read_fd], [], [], timeout)
            if not ready:
                return
            try:
                chunk = os.read(self.read_fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                self._lost()
                return
            self._buffer += chunk
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                self._heard(json.loads(line))

    def _heard(self, message: dict[str, Any]) -> None:
        ref = int(message["ref"])
        if "exit" in message:
            child = self._children.pop(ref, None)
            if child is not None:
                child._exitcode = int(message["exit"])
            return
        if "pid" in message:
            self._children[ref] = Child(self, int(message["pid"]))
            message = {**message, "child": self._children[ref]}
        self._waiting[ref] = message

    def _lost(self) -> None:
        """The host is gone: so are its children (they die with it)."""
        self.gone = True
        for child in self._children.values():
            child._exitcode, child.host_gone = HOST_GONE, True
        self._children.clear()

    def close(self) -> None:
        """End the host this process spawned, at once (its children die with it): a host still
        importing torch would read the closed pipe only seconds later, and the command that
        owns it must not wait for that at its exit. A shared host is left to end by itself
        when its last member goes (a launcher that ends or is killed leaves its workers' runs
        running); a forked copy of the owner (its pid is another) closes its copies of the
        channels only: neither host is its to end."""
        self.gone = True
        for fd in dict.fromkeys((self.write_fd, self.read_fd)):  # a joined host's: one fd
            with contextlib.suppress(OSError):
                os.close(fd)
        if os.getpid() == self.pid and not self.shared and self.process is not None:
            kill_descendants(self.process.pid)  # what a preloaded library started there too
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            self.process.wait()


_hosts: dict[int, TaskHost] = {}
_adopted: list[tuple[int, int]] = []  # (pid, socket fd): set in a host's child
_spawn_lock = threading.Lock()


def adopt(fd: int) -> None:
    """In a host's child: its socket to the host that forked it."""
    _hosts.clear()
    _adopted[:] = [(os.getpid(), fd)]


def current(preload: Sequence[str] = ()) -> TaskHost:
    """This process's host: the one that forked it, else its own (spawned on first use; it
    imports ``preload`` right after torch, before any request names them)."""
    pid = os.getpid()
    with _spawn_lock:
        host = _hosts.get(pid)
        if host is not None and not host.gone:
            return host
        if _adopted and _adopted[0][0] == pid and host is None:
            fd = _adopted[0][1]
            host = TaskHost(fd, fd, None)
        else:
            host = _join(os.environ.pop(SHARED_HOST, "")) or _spawn(preload)
            atexit.register(host.close)
        _hosts.clear()  # a forked copy of a process never uses its parent's host
        _hosts[pid] = host
        return host


def start_early(preload: Sequence[str] = ()) -> None:
    """Spawn this process's host now without waiting for it: its imports (torch, seconds, and
    ``preload``: a run's loop) then overlap the caller's own work, and the first child finds
    it ready."""
    current(preload)


def share_path() -> str | None:
    """Where another process joins this process's host (spawned now if it has none): the
    value of ``CAMPAIGN_SHARED_HOST`` for the workers of a local launch, so that N workers
    import torch once, in one host, and their runs fork from it in milliseconds. None when
    the host is not this process's own (a host's child, a member): its workers then start
    hosts of their own."""
    host = current()
    if host.share_path is None or host.gone:
        return None
    host.shared = True
    return host.share_path


def _join(address: str) -> TaskHost | None:
    """A connection to the host listening at ``address`` (the variable is read once and
    removed, and never passed on in a request, so that nothing this process starts joins by
    mistake); None when there is none (its launcher's host is gone: this process then spawns
    a host of its own)."""
    if not address.startswith("@"):
        return None
    joined = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        joined.connect("\0" + address[1:])
    except OSError:
        joined.close()
        return None
    fd = joined.detach()
    return TaskHost(fd, fd, None)


def _spawn(preload: Sequence[str] = ()) -> TaskHost:
    # Without the thread settings: torch in the host computes its defaults, and each child
    # takes the settings of its own request (campaign.host.child), as a new interpreter would.
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    # Bound here, before the host starts: a member may connect at once and wait in the backlog
    # while the host imports torch. Abstract (Linux): no file to remove, whatever ends this
    # process; the host accepts only processes of this user (SO_PEERCRED).
    name = f"campaign-host-{os.getpid()}-{secrets.token_hex(8)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(128)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "campaign.host.host_process", str(os.getpid()),
             str(listener.fileno()), *preload],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=os.getcwd(), close_fds=True,
            env=env, pass_fds=(listener.fileno(),),
        )
    finally:
        listener.close()
    assert process.stdin is not None and process.stdout is not None
    read_fd, write_fd = os.dup(process.stdout.fileno()), os.dup(process.stdin.fileno())
    process.stdout.close()
    process.stdin.close()
    os.set_inheritable(read_fd, False)
    os.set_inheritable(write_fd, False)
    return TaskHost(read_fd, write_fd, process, "@" + name)
