"""What every engine's task shares (Ray, SLURM): the refusal to place, the launch's working
directory, and the worker options as plain values.

An engine ships a task's arguments to another process (often another
machine) as plain values: the worker options as a document and the launch's
working directory, so that a task reference such as ``mytasks:build``
resolves there as it did at launch.
"""

from __future__ import annotations

import os
import sys
import time

__all__ = ["PlacementError", "enter", "options_document", "options_from", "settle"]

from campaign.errors import PlacementError
from campaign.launch.live_table import ProgressDisplay
from campaign.launch.worker import WorkerOptions, options_document, options_from
from campaign.ledger import Ledger
from campaign.ledger.progress import Snapshot, take_snapshot


def enter(cwd: str) -> None:
    """Work in the launch's directory, with it on the import path (a task's module)."""
    if os.path.isdir(cwd):
        os.chdir(cwd)
        if cwd not in sys.path:
            sys.path.insert(0, cwd)


def settle(ledger: Ledger, options: WorkerOptions, display: ProgressDisplay) -> Snapshot:
    """After the engine's last task ended: a run still ``running`` has no process left (its
    task was killed, its node lost). Sweep until the lease rule declares it ``lost`` (at most
    one lease and a few heartbeats), so the launcher's exit speaks of every run and nothing it
    placed is left ``running``."""
    deadline = time.monotonic() + options.lease_s + 3 * options.heartbeat_s
    snapshot = take_snapshot(ledger, options.campaign)
    while snapshot.running and time.monotonic() < deadline:
        time.sleep(min(1.0, options.heartbeat_s))
        ledger.mark_lost(options.lease_s, options.campaign)
        snapshot = take_snapshot(ledger, options.campaign)
        display.show(snapshot)
    return snapshot
