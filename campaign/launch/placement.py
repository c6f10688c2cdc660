"""What an engine's task does with one run, shared by the Ray and SLURM executors.

An engine ships the task's arguments to another process (often another
machine) as plain values: the ledger URL, the worker options as a document,
the run id and the launch's working directory (so that a task reference such
as ``mytasks:build`` resolves there as it did at launch). The task opens the
ledger itself and executes the run with :func:`run_one`, which copes with the
engine running it more than once.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from typing import Any

__all__ = ["options_document", "options_from"]  # what the executors use

from campaign.launch.worker import options_document, options_from, run_one
from campaign.ledger import Ledger
from campaign.loop.outcome import RunOutcome


class PlacementError(RuntimeError):
    """An executor cannot place this campaign (missing extra, no scheduler, impossible request)."""


def run_placed(
    url: str, document: dict[str, Any], run_id: str, cwd: str, **overrides: Any
) -> RunOutcome | None:
    """Execute ``run_id`` in this process as an engine's task; None when it had already ended."""
    if os.path.isdir(cwd):
        os.chdir(cwd)
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
    with Ledger.open(url) as ledger:
        return run_one(ledger, options_from(document, **overrides), run_id)


def outcome_document(run_id: str, outcome: RunOutcome | None) -> dict[str, Any]:
    """What the task returns to the engine (plain values)."""
    return {"run_id": run_id, "status": "already ended"} if outcome is None else asdict(outcome)
