"""Files a command writes for its user (reports, archives): whole or not at all.

A temporary file beside the target, renamed into place; on any failure
(unwritable folder, full disk, Ctrl-C) the temporary file is removed and the
error propagates for the command to say in one line. A target that exists and
is not a regular file (``/dev/full``, a FIFO, a folder) is refused: renaming
over a device node as root would replace the device itself.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


class NotAFileTarget(OSError):
    """The output path names something other than a regular file."""


def check_target(path: Path) -> None:
    """Refuse, before any work, a target that exists and is not a regular file, or whose
    folder cannot be made (an :class:`OSError` naming why)."""
    if path.exists() and not path.is_file():
        raise NotAFileTarget(f"{path} exists and is not a regular file")
    path.parent.mkdir(parents=True, exist_ok=True)


def write_atomically(path: Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(temporary)`` then rename the temporary file to ``path``."""
    check_target(path)
    temporary = path.with_name(f".{path.name}.partial")
    try:
        write(temporary)
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path
