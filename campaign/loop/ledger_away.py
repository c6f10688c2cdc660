"""A run keeps training while its ledger is away (docs/runs.md, faults).

An outage of the ledger is not the run's: its metric writer keeps the points (in memory, then
in the run folder's spill file, ledger/spill.py) and the records of the checkpoints it writes
wait here, in order, to be written once the ledger answers (at the next checkpoint, and before
the run's end: a resume only trusts a checkpoint the ledger names). An outage that outlasts
``CAMPAIGN_LEDGER_OUTAGE_S`` ends the run at its next checkpoint, ``interrupted`` with the
cause ``ledger_unreachable``: its end is written when the ledger answers again, by the run
or its supervisor, and it resumes from that checkpoint.
"""

from __future__ import annotations

from typing import Any

from campaign.errors import LedgerUnreachable
from campaign.ledger import Ledger
from campaign.ledger.outage import outage_s
from campaign.loop.run_files import record_file


class CheckpointRecords:
    """The checkpoints of one segment whose ledger records are still to be written."""

    def __init__(self, ledger: Ledger, run_id: str) -> None:
        self.ledger, self.run_id = ledger, run_id
        self.pending: list[Any] = []  # saved checkpoints (path, step, sha256), oldest first

    def record(self, saved: Any, lease: str | None) -> int | None:
        """Record ``saved`` (and any still waiting) now if the ledger answers; else keep it
        and go on training. Returns the artifact id, None while it waits."""
        self.pending.append(saved)
        return self.flush(lease, patient=False)

    def flush(self, lease: str | None, *, patient: bool = True) -> int | None:
        """Write the waiting records, oldest first; ``patient``: ride out an outage (before
        the run's end), else give up at once and keep them. The last record's id."""
        ledger = self.ledger if patient else self.ledger.impatient()
        last = None
        while self.pending:
            saved = self.pending[0]
            try:
                last = record_file(ledger, self.run_id, "checkpoint", saved.path, saved.step,
                                   lease=lease, sha256=saved.sha256)
            except LedgerUnreachable:
                if patient:
                    raise
                return None
            self.pending.pop(0)
        return last


def end_if_away_too_long(metrics: Any, step: int) -> None:
    """After a checkpoint is on disk: an outage past the limit ends the run here (stop.py
    makes a LedgerUnreachable ``interrupted``/``ledger_unreachable``)."""
    away = metrics.away_s() if hasattr(metrics, "away_s") else 0.0
    limit = outage_s()
    if away > limit:
        raise LedgerUnreachable(
            f"the ledger was away for {away:.0f} s, past CAMPAIGN_LEDGER_OUTAGE_S={limit:g}: "
            f"the run stops at its checkpoint of update {step}")
