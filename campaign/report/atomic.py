"""Files a command writes for its user (reports, archives): whole or not at all.

A temporary file beside the target, created exclusively (a fresh name: a planted
``.NAME.partial`` symlink is never written through), renamed into place; on any failure
(unwritable folder, full disk, Ctrl-C) the temporary file is removed and the error
propagates for the command to say in one line. A target that exists and is not a regular
file (``/dev/full``, a FIFO, a folder) or is a symbolic link is refused: renaming over a
device node as root would replace the device itself, and a link points at a file the user
did not name. A target that is one of the campaign's inputs
(:class:`~campaign.report.inputs.CampaignInputs`) is refused too.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from campaign.report.inputs import CampaignInputs


class NotAFileTarget(OSError):
    """The output path names something other than a regular file, or an input."""


def check_target(path: Path, inputs: CampaignInputs | None = None) -> None:
    """Refuse, before any work, a target that is a link, exists and is not a regular file,
    is an input of the campaign, or whose folder cannot be made (an :class:`OSError`)."""
    if path.is_symlink():
        raise NotAFileTarget(f"{path} is a symbolic link: name the file itself")
    if path.exists() and not path.is_file():
        raise NotAFileTarget(f"{path} exists and is not a regular file")
    refusal = inputs.refusal(path) if inputs is not None else None
    if refusal is not None:
        raise NotAFileTarget(refusal)
    path.parent.mkdir(parents=True, exist_ok=True)


def write_atomically(
    path: Path, write: Callable[[Path], None], inputs: CampaignInputs | None = None
) -> Path:
    """Call ``write(temporary)`` then rename the temporary file to ``path``."""
    check_target(path, inputs)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(handle)
    temporary = Path(name)
    os.chmod(temporary, 0o666 & ~_umask())  # mkstemp's 0600 is for the temporary only
    try:
        write(temporary)
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
