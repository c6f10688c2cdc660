"""Run a command in a fresh interpreter and read its one JSON answer.

A fresh process is the proof the pilot and the replay rely on: whatever the
training process kept in memory (caches, RNG, patched modules) is not there,
so only what was written to disk can make the answer right.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any


class FreshProcessFailed(Exception):
    """The fresh interpreter exited with an error (its last stderr line is the message)."""


def run_json(
    arguments: Sequence[str], *, env: Mapping[str, str] | None = None, timeout_s: float = 600
) -> Any:
    """``python ARGUMENTS`` in the current directory; its stdout parsed as one JSON document."""
    done = subprocess.run(
        [sys.executable, *arguments],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=os.getcwd(),
        env=dict(env) if env is not None else None,
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise FreshProcessFailed(lines[-1] if lines else f"exit status {done.returncode}")
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError as error:
        raise FreshProcessFailed(f"no JSON answer on stdout ({error})") from None
