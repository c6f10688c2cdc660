"""The quick task with user code that misbehaves on purpose (the supervisor's tests).

``task.misbehave`` names what the first training ``loss()`` call does:
``hang`` (sleeps for ever), ``exit0``/``exit7`` (``sys.exit``), ``keyboard``
(raises ``KeyboardInterrupt``), ``os_exit3`` (``os._exit(3)``), ``segv``
(a real segmentation fault), ``orphan`` (forks a child that ignores SIGTERM
and sleeps, then hangs), ``daemon`` (a double-forked ``setsid`` daemon, then trains
on), ``chatty`` (prints on stdout and stderr),
``negative`` (returns negative units), ``hang_backward`` (the forward returns, its
backward hangs). ``task.factory`` = ``exit0``,
``hang`` or ``chatty`` misbehaves in the factory instead, ``task.splits`` = ``hang`` in
``splits()``. ``task.pidfile``: where ``orphan`` writes its child's pid.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from tests.support.tasks.quick import QuickTask


def _hang() -> None:
    while True:
        time.sleep(0.5)


class Misbehaving(QuickTask):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        options = config.get("task", {})
        self.misbehave = options.get("misbehave")
        self.pidfile = options.get("pidfile")
        self.hang_splits = options.get("splits") == "hang"
        self.calls = 0

    def splits(self) -> dict[str, Sequence[dict[str, Any]]]:
        if self.hang_splits:
            _hang()
        return super().splits()

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
        self.calls += 1
        if model.training and self.calls == 1:
            self._misbehave()
        total, units = super().loss(model, batch)
        if self.misbehave == "hang_backward" and model.training and self.calls == 1:
            total.register_hook(lambda gradient: _hang())  # the forward returns; backward hangs
        return (total, -units) if self.misbehave == "negative" else (total, units)

    def _misbehave(self) -> None:
        what = self.misbehave
        if what == "hang":
            _hang()
        elif what in ("exit0", "exit7"):
            sys.exit(int(what[-1]))
        elif what == "keyboard":
            raise KeyboardInterrupt
        elif what == "os_exit3":
            os._exit(3)
        elif what == "segv":
            ctypes.string_at(0)
        elif what == "orphan":
            child = os.fork()
            if child == 0:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                _hang()
            if self.pidfile:
                with open(self.pidfile, "w") as handle:
                    handle.write(str(child))
            _hang()
        elif what == "daemon":  # a double-forked, setsid daemon; training goes on
            middle = os.fork()
            if middle == 0:
                os.setsid()  # out of the run's process group and session
                if os.fork() == 0:
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                    if self.pidfile:
                        with open(self.pidfile, "w") as handle:
                            handle.write(str(os.getpid()))
                    _hang()
                os._exit(0)
            os.waitpid(middle, 0)
            while self.pidfile and not os.path.exists(self.pidfile):
                time.sleep(0.01)
        elif what == "chatty":
            print("task says hello on stdout")
            print("task says hello on stderr", file=sys.stderr)


def build(config: dict[str, Any]) -> Misbehaving:
    factory = config.get("task", {}).get("factory")
    if factory == "exit0":
        sys.exit(0)
    if factory == "hang":
        _hang()
    if factory == "chatty":
        print("a factory that talks on stdout")
    return Misbehaving(config)
