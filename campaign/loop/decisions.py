"""How a run decides to end beyond its own update: what an earlier segment already did at
its last step, so that a resume at the budget ends the run without going past it (no update,
no second validation, no second final artifact: the budget is a held key, and a final
artifact whose hash an archive holds must never change under it); and the one decision all
replicas of a run take together after each update."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import torch

from campaign.ledger import Ledger
from campaign.loop import replicas as dp
from campaign.loop.checkpoint_file import file_sha256
from campaign.loop.run_files import locate
from campaign.loop.signals import SignalLatch
from campaign.loop.stop import StopDecision


def validated_at(ledger: Ledger, campaign: str, run_id: str, step: int) -> bool:
    """Whether the run recorded a validation point at ``step`` (in any segment)."""
    points = ledger.metrics(campaign, keys=["val/loss"], runs=[run_id])
    return bool((points["step"] == step).any())


def final_recorded(ledger: Ledger, campaign: str, run_id: str, step: int,
                   artifacts: Path) -> bool:  # fmt: skip
    """Whether the ledger names a final artifact of ``step`` whose file, where it is now
    (its recorded path, else under ``artifacts`` as a resume finds checkpoints), still
    matches its hash (a damaged or missing one is left alone: the resumed segment writes
    its own, under its own name)."""
    frame = ledger.artifacts(campaign)
    finals = frame[(frame["run_id"] == run_id) & (frame["kind"] == "final")
                   & (frame["step"] == step)]  # fmt: skip
    for row in finals.itertuples():
        path = locate(str(row.path), artifacts, run_id)
        if path.is_file() and file_sha256(path) == row.sha256:
            return True
    return False


def agree(
    stop: StopDecision | None, signals: SignalLatch, lease_lost: threading.Event,
    device: torch.device,
) -> StopDecision | None:  # fmt: skip
    """Every rank takes the same decision after each update (one small all-reduce): a
    signal, a lost lease or a stop rule on any rank stops all of them."""
    mine = [signals.received is not None, lease_lost.is_set(), stop is not None]
    signalled, lost, stopping = dp.any_ranks(mine, device)
    if signalled and signals.received is None:
        signals.request(signal.SIGTERM)  # another rank was signalled
    if lost:
        lease_lost.set()
    if stopping and stop is None:  # e.g. the wall-time rule fired on another rank first
        stop = StopDecision("stopped", "wall_time", "stopped together with another replica")
    return stop
