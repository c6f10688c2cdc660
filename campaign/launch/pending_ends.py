"""A run's end that its ledger was not there to take, kept in the run's folder until it is.

A run that the ledger left for longer than ``CAMPAIGN_LEDGER_OUTAGE_S`` stops at a checkpoint
(loop/ledger_away.py); its process, then its supervisor, try to write its end. When even the
supervisor must give up, it leaves the end it decided in ``pending-end.json`` beside the run's
spill file, and the next worker with the same artifacts folder that finds the ledger answering
writes both (the points first: an ended segment takes no more), under the run's lease, so a
run that was resumed or declared lost meanwhile is left alone (docs/runs.md, faults). Until
then the run is ``running`` with a stale heartbeat; a sweep that comes first declares it
``lost``, resumable all the same.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from campaign.errors import LeaseLost, LedgerError
from campaign.ledger import Claim, Ledger, StopRecord
from campaign.ledger.spill import SPILL_NAME
from campaign.loop.ledger_away import WAITING_NAME, record_left_waiting

PENDING_END = "pending-end.json"


def leave_pending_end(folder: Path, claim: Claim, status: str, stop: StopRecord) -> None:
    """Keep the end the ledger could not take, for the next worker (written whole or not)."""
    document = {"run_id": claim.run_id, "segment_id": claim.segment_id, "lease": claim.lease,
                "status": status, "cause": stop.cause, "step": stop.step,
                "phase": stop.phase, "detail": stop.detail}
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / (PENDING_END + ".partial")
    partial.write_text(json.dumps(document))
    partial.replace(folder / PENDING_END)


def settle_pending_ends(ledger: Ledger, artifacts: Path, campaign: str) -> list[str]:
    """Write the ends left in ``artifacts``' run folders for ``campaign``'s runs; the ids."""
    settled = []
    for path in sorted(artifacts.glob(f"*/{PENDING_END}")):
        with contextlib.suppress(OSError, ValueError, KeyError):
            pending = json.loads(path.read_text())
            if ledger.run(pending["run_id"]).campaign != campaign:
                continue
            if _settle(ledger, path.parent, pending):
                settled.append(pending["run_id"])
            path.unlink(missing_ok=True)
    return settled


def _settle(ledger: Ledger, folder: Path, pending: dict) -> bool:
    """False when the run moved on meanwhile (its lease is gone): nothing is written."""
    run_id, lease = pending["run_id"], pending["lease"]
    try:
        if (folder / SPILL_NAME).exists():
            with ledger.metric_writer(run_id, int(pending["segment_id"]), lease=lease,
                                      spill=folder / SPILL_NAME) as leftover:
                leftover.write_spilled()
        record_left_waiting(ledger, folder, run_id, lease)  # the checkpoints it wrote
        ledger.finish(run_id, pending["status"],
                      StopRecord(pending["cause"], pending["step"], pending["phase"],
                                 pending["detail"]), lease=lease)
    except LeaseLost:  # what it left waiting is not the next segment's either
        (folder / WAITING_NAME).unlink(missing_ok=True)
        return False
    except LedgerError as error:
        if "lease" in str(error) or ledger.run(run_id).status != "running":
            return False
        raise
    return True
