"""A run's progress as its supervisor sees it: a page of memory shared with the run's process.

The supervisor (:mod:`campaign.launch.supervisor`) decides whether a run is
alive from this page, not from a thread that stamps regardless: the loop
ticks it at every phase change, every microbatch and every validation batch,
so a task hung in ``loss()`` stops the counter and the supervisor sees the
stall, the phase it happened in and the last completed update. A tick is a
few bytes written into a shared mapping of a small file beside the run's log:
no system call, nothing to measure against a training step. Outside a supervised process nothing is
installed and a tick does nothing.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

_LAYOUT = struct.Struct("<QQ32s")  # tick counter, last completed update, phase name
# After it, written by the supervisor only: the stop signal it forwarded, so a run whose
# handlers were not installed yet when the signal came (it was ignored) still stops.
_REQUEST = struct.Struct("<i")


@dataclass(frozen=True)
class Progress:
    """What the page says: ``ticks`` grows while the run makes progress."""

    ticks: int
    step: int
    phase: str


class ProgressBoard:
    """The shared page, mapped from ``path`` (``create``: the supervisor makes and zeroes it;
    the run's process maps the same file, writes, and the supervisor reads)."""

    def __init__(self, path: Path, *, create: bool = False, step: int = 0) -> None:
        """``step`` (with ``create``): the update the segment starts from (a resume's), what
        the page says until the run's process says more; the process reads it from the page."""
        if create:
            path.write_bytes(bytes(mmap.PAGESIZE))
        with open(path, "r+b") as handle:
            self._page = mmap.mmap(handle.fileno(), mmap.PAGESIZE)
        self._ticks, self._step, self._phase = 0, step, b"setup"
        if create:
            self._write()
        else:
            self._ticks, self._step, phase = _LAYOUT.unpack_from(self._page, 0)
            self._phase = phase.rstrip(b"\0") or b"setup"

    def tick(self, phase: str | None = None, step: int | None = None) -> None:
        self._ticks += 1
        if phase is not None:
            self._phase = phase.encode("ascii", "replace")[:32]
        if step is not None:
            self._step = step
        self._write()

    def _write(self) -> None:
        _LAYOUT.pack_into(self._page, 0, self._ticks, self._step, self._phase)

    def request_stop(self, signum: int) -> None:
        """The supervisor's side: say which stop signal it is about to send (before sending)."""
        _REQUEST.pack_into(self._page, _LAYOUT.size, signum)

    def requested_stop(self) -> int | None:
        """The run's side: the stop signal its supervisor sent, if any."""
        (signum,) = _REQUEST.unpack_from(self._page, _LAYOUT.size)
        return signum or None

    def read(self) -> Progress:
        ticks, step, phase = _LAYOUT.unpack_from(self._page, 0)
        return Progress(ticks, step, phase.rstrip(b"\0").decode("ascii", "replace"))

    def close(self) -> None:
        self._page.close()


_installed: ProgressBoard | None = None


def install(board: ProgressBoard | None) -> None:
    """Make ``board`` the one :func:`tick` writes to (in the supervised child)."""
    global _installed
    _installed = board


def requested_stop() -> int | None:
    """The stop signal this run's supervisor sent, read when the run installs its handlers
    (None outside a supervised process)."""
    return None if _installed is None else _installed.requested_stop()


def tick(phase: str | None = None, step: int | None = None) -> None:
    """Say the run is making progress (and, when given, in which phase and after which update)."""
    if _installed is not None:
        _installed.tick(phase, step)
