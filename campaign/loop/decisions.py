"""How a run decides to end beyond its own update: what an earlier segment already did at
its last step, so that a resume at the budget ends the run without going past it (no update,
no second validation, no second final artifact: the budget is a held key, and a final
artifact whose hash an archive holds must never change under it); and the one decision all
replicas of a run take together after each update.

A stop that ends a run before its budget (early stopping, the wall time) is recorded as a
``stop_decided`` event before the run checkpoints and exports: a resume after a kill during
the export ends the run at that step with that decision instead of training on past it (the
wall-time clock restarts in every segment, and early stopping only decides at a validation).
"""

from __future__ import annotations

import json
import signal
import threading
from dataclasses import asdict
from pathlib import Path

import torch

from campaign.ledger import Ledger
from campaign.loop import replicas as dp
from campaign.loop.checkpoint_file import file_sha256
from campaign.loop.run_files import locate
from campaign.loop.signals import SignalLatch
from campaign.loop.stop import StopDecision, StopRules


def validated_at(ledger: Ledger, campaign: str, run_id: str, step: int) -> bool:
    """Whether the run recorded a validation point at ``step`` (in any segment)."""
    points = ledger.metrics(campaign, keys=["val/loss"], runs=[run_id])
    return bool((points["step"] == step).any())


STOP_DECIDED = "stop_decided"  # the event that holds a decided stop (JSON of StopDecision)


def record_stop(ledger: Ledger, campaign: str, run_id: str, stop: StopDecision,
                step: int, lease: str | None) -> None:
    """Record ``stop``, taken at ``step``, before anything the end may be killed in."""
    detail = json.dumps({**asdict(stop), "step": step}, sort_keys=True)
    ledger.add_event(campaign, STOP_DECIDED, detail, run_id=run_id, lease=lease)


def recorded_stop(ledger: Ledger, campaign: str, run_id: str) -> StopDecision | None:
    """The stop an earlier segment of the run decided (its latest), or None."""
    events = ledger.events(campaign, run_id=run_id)
    decided = events[events["kind"] == STOP_DECIDED]
    if decided.empty:
        return None
    return StopDecision(**json.loads(decided["detail"].iloc[-1]))


def stop_at_resume(ledger: Ledger, campaign: str, run_id: str, step: int,
                   rules: StopRules) -> tuple[StopDecision | None, StopDecision | None]:
    """(the stop an earlier segment decided, the stop a resume restored at ``step`` takes at
    once): the decided stop when the run is at or past its step (killed while ending), its
    budget when the checkpoint is at it (a signal in the last update), else None."""
    decided = recorded_stop(ledger, campaign, run_id)
    if decided is not None and decided.step is not None and step >= decided.step:
        return decided, decided
    at_budget = rules.after_update(step)
    return decided, at_budget if at_budget is not None and at_budget.cause == "budget_reached" \
        else None


def final_recorded(ledger: Ledger, campaign: str, run_id: str, step: int,
                   artifacts: Path) -> bool:
    """Whether the ledger names a final artifact of ``step`` whose file, where it is now
    (its recorded path, else under ``artifacts`` as a resume finds checkpoints), still
    matches its hash (a damaged or missing one is left alone: the resumed segment writes
    its own, under its own name)."""
    frame = ledger.artifacts(campaign)
    finals = frame[(frame["run_id"] == run_id) & (frame["kind"] == "final")
                   & (frame["step"] == step)]
    for row in finals.itertuples():
        path = locate(str(row.path), artifacts, run_id)
        if path.is_file() and file_sha256(path) == row.sha256:
            return True
    return False


def agree(
    stop: StopDecision | None, signals: SignalLatch, lease_lost: threading.Event,
    device: torch.device,
) -> tuple[StopDecision | None, bool]:
    """Every rank takes the same decision after each update (one small all-reduce): a
    signal, a lost lease or a stop rule on any rank stops all of them. Returns the stop and
    whether a signal stops the run now: every rank's answer is this one, so a signal that
    arrives after the reduction waits for the next update (a rank alone would otherwise
    start the checkpoint's collectives)."""
    mine = [signals.received is not None, signals.preempted, lease_lost.is_set(),
            stop is not None]
    signalled, preempted, lost, stopping = dp.any_ranks(mine, device)
    if signalled and signals.received is None:  # another rank was signalled: a scheduler's
        # preemption (its step got the warning first) ends the run as preempted here too
        signals.request(signals.preempt_signals[0] if preempted and signals.preempt_signals
                        else signal.SIGTERM)
    if lost:
        lease_lost.set()
    if stopping and stop is None:  # e.g. the wall-time rule fired on another rank first
        stop = StopDecision("stopped", "wall_time", "stopped together with another replica")
    return stop, signalled
