"""The task host's own process: ``python -m campaign.host.host_process OWNER_PID LISTENING_FD
[MODULE ...]``.

It imports what every child needs (``PRELOAD``), then serves requests until
its owner goes: each request line (JSON, from the owner's pipe, from one of
its children's sockets, or from a member that connected to its listening socket:
a local launch's workers share their launcher's host) asks for one child, which is forked at once
(:func:`campaign.host.child.become`); the host answers with the child's pid,
reaps it when it ends and answers with its exit code. It never computes, never
initialises CUDA, and has no thread, so every fork is safe and starts in
milliseconds. It ignores the signals a scheduler sends to every process of a
job (SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2): the supervisor decides what
they mean. Nothing is pickled: requests and answers are JSON lines.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from campaign.host.preloads import Preloads
from campaign.host.processes import (
    SCHEDULER_SIGNALS,
    become_subreaper,
    kill_descendants,
    kill_group,
)

# What every child needs; a request names more (a run: the loop; the pilot: its gates), imported
# once on the first request that names them and inherited by every later child.
PRELOAD = ("torch", "campaign.host.child")
OWNER_POLL_S = 0.5


@dataclass
class Connection:
    """One requester: the owner (its pipe), a member (a connection to the listening socket)
    or a child (a socket pair made at its fork)."""

    read_fd: int
    write_fd: int
    owner: bool = False
    member: bool = False  # connected to the listening socket: its children die with it
    buffer: bytes = b""

    def send(self, message: dict[str, Any]) -> None:
        if self.write_fd < 0:  # gone: its fd number may belong to a newer connection now
            return
        data = (json.dumps(message) + "\n").encode()
        with contextlib.suppress(OSError):  # a requester that went away hears nothing
            while data:
                data = data[os.write(self.write_fd, data):]


class HostProcess:
    """The serving loop's state: connections, live children and who asked for each."""

    def __init__(self, owner: int, answers: int, default_threads: int | None = None,
                 listener: socket.socket | None = None) -> None:
        self.owner = owner
        self.listening = listener  # members connect here (a local launch's workers)
        if listener is not None:
            listener.setblocking(False)
        self.default_threads = default_threads  # torch's own choice without OMP_NUM_THREADS
        self.connections: dict[int, Connection] = {0: Connection(0, answers, owner=True)}
        self.children: dict[int, tuple[Connection, int]] = {}  # pid -> (requester, ref)
        self.wake_read, wake_write = os.pipe()
        for fd in (self.wake_read, wake_write):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select through the pipe
        self.wake_write = wake_write
        self.preloads = Preloads()  # what it imports before each fork

    def serve(self) -> None:
        while self._wanted():
            watched = select.poll()  # not select(): a shared host may hold over 1024 fds
            for fd in [*self.connections, self.wake_read, *self._listening()]:
                watched.register(fd, select.POLLIN)
            ready = [fd for fd, _ in watched.poll(OWNER_POLL_S * 1000)]
            if set(self._listening()) & set(ready):
                self._accept()
            if self.wake_read in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self.wake_read, 512):
                        pass
            self._reap()
            for fd in ready:
                if fd in self.connections:
                    self._read(self.connections[fd])
        self._end()

    def _listening(self) -> list[int]:
        """The listening socket's fd, while members may still join."""
        return [] if self.listening is None else [self.listening.fileno()]

    def _wanted(self) -> bool:
        """Serving while the owner lives; once it is gone, while a member still is (a
        launcher killed with SIGKILL leaves its workers' runs running: only they end them).
        The owner's own children go with it at once, and no member joins any more."""
        if 0 in self.connections and os.getppid() == self.owner:
            return True
        owner = self.connections.get(0)
        if owner is not None:
            self._drop(owner)
        if self.listening is not None:
            self.listening.close()
            self.listening = None
        return any(connection.member for connection in self.connections.values())

    def _end(self) -> NoReturn:
        """The owner is gone: so are its children, at once (a run must not write another
        update for a supervisor that was killed), then this process, without a slow exit."""
        for pid in self.children:
            kill_group(pid)
        kill_descendants(os.getpid())  # what a preloaded library started (the host reaps it)
        os._exit(0)

    def _read(self, connection: Connection) -> None:
        try:
            chunk = os.read(connection.read_fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:  # the requester is gone: an owner's or a member's children go with it
            # (_drop); a child's own children follow that child (`follow`)
            self._drop(connection)
            return
        connection.buffer += chunk
        while b"\n" in connection.buffer:
            line, connection.buffer = connection.buffer.split(b"\n", 1)
            if line.strip():
                self._start(connection, json.loads(line))

    def _accept(self) -> None:
        """A member joins (a worker of the launch that owns this host): it asks for children
        as the owner does, and when it goes (its exit, a kill -9) its children go with it, as
        they would with a host of its own."""
        assert self.listening is not None
        try:
            joined, _ = self.listening.accept()
        except OSError:  # it went away before it was accepted
            return
        credentials = joined.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                        struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", credentials)
        if uid != os.getuid():  # an abstract socket has no file mode: only this user joins
            joined.close()
            return
        joined.setblocking(True)
        fd = joined.detach()  # every child closes it (_descriptors)
        self.connections[fd] = Connection(fd, fd, member=True)

    def _drop(self, connection: Connection) -> None:
        if connection.member or connection.owner:  # gone: nothing it started may write on
            for pid, (requester, _) in list(self.children.items()):
                if requester is connection:
                    kill_group(pid)
        del self.connections[connection.read_fd]
        if not connection.owner:
            with contextlib.suppress(OSError):
                os.close(connection.read_fd)
        connection.write_fd = -1  # its children's ends are told nothing more

    def _start(self, requester: Connection, request: dict[str, Any]) -> None:
        ref = request.get("ref", 0)
        self.preloads.before_fork(request)
        warm_caches()
        mine, theirs = socket.socketpair()
        try:
            pid = os.fork()
        except OSError as error:
            mine.close()
            theirs.close()
            requester.send({"ref": ref, "error": f"fork failed: {error}"})
            return
        if pid == 0:
            from campaign.host.child import become

            mine.close()
            become(request, theirs.detach(), self._descriptors(), self.default_threads)
        theirs.close()
        with contextlib.suppress(OSError):  # the child's own group, before anyone signals it
            os.setpgid(pid, pid)
        fd = mine.detach()
        self.connections[fd] = Connection(fd, fd)
        self.children[pid] = (requester, ref)
        requester.send({"ref": ref, "pid": pid})

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            requester, ref = self.children.pop(pid, (None, 0))
            if requester is not None:
                exit_code = os.waitstatus_to_exitcode(status)
                requester.send({"ref": ref, "pid": pid, "exit": exit_code})

    def _descriptors(self) -> list[int]:
        """What a child must close: every requester's channel and the wake-up pipe (the owner's
        pipe is the host's fds 0 and 1, which the child replaces with its own streams)."""
        channels = {fd for c in self.connections.values() for fd in (c.read_fd, c.write_fd)}
        return sorted({self.wake_read, self.wake_write, *channels, *self._listening()}
                      - {0, 1, 2})


def warm_caches() -> None:
    """Answers every child would work out alike, worked out once here: the ledger's head
    revision, which each ``Ledger.open`` checks (parsing the revision files: about 13 ms in
    every run's process otherwise). Only when the ledger's code is imported already."""
    migrate = sys.modules.get("campaign.ledger.migrate")
    if migrate is not None:
        with contextlib.suppress(Exception):  # a child that needs it raises it there
            migrate.head_revision()


def main(owner: int, preload: Sequence[str] = (), listener: int | None = None) -> None:
    """Serve ``owner`` (and the members that join through the socket ``listener``, an fd the
    owner bound and passed) after importing ``PRELOAD`` and ``preload``."""
    for signum in SCHEDULER_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    # Ignored, not blocked: a mask inherited from the owner (a Ray worker blocks SIGINT) would
    # also be every child's until it clears its own; SIGCHLD must reach the loop.
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    if os.getppid() != owner:  # the owner is already gone
        return
    become_subreaper()  # a process a preloaded library starts stays in the host's tree
    # fd 1 is the answer channel: moved away, so that nothing a preload prints (Python or C)
    # can reach it; fd 1 becomes stderr.
    answers = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for name in (*PRELOAD, *preload):  # torch, then what the owner named (a run's modules)
        with contextlib.suppress(Exception):  # a module that fails here fails in its child
            importlib.import_module(name)
    warm_caches()
    torch = sys.modules.get("torch")  # reads the setting, starts no thread pool
    listening = None if listener is None else socket.socket(fileno=listener)
    HostProcess(owner, answers, torch.get_num_threads() if torch is not None else None,
         listening).serve()


if __name__ == "__main__":
    # OWNER_PID LISTENING_FD [MODULE ...]: the socket members join by (the owner bound it, so
    # a member may connect while this process still imports), then what the owner named
    main(int(sys.argv[1]), sys.argv[3:], int(sys.argv[2]))
