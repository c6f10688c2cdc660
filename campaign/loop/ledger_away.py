"""A run keeps training while its ledger is away (docs/runs.md, faults).

An outage of the ledger is not the run's: its metric writer keeps the points (in memory, then
in the run folder's spill file, ledger/spill.py) and the records of the checkpoints it writes
(and of its predictions, its phase measurements) wait here, in order, to be written once the
ledger answers (at the next such write, and before the run's end: a resume only trusts a
checkpoint the ledger names). An outage that outlasts
``CAMPAIGN_LEDGER_OUTAGE_S`` ends the run at its next checkpoint, ``interrupted`` with the
cause ``ledger_unreachable``: its end is written when the ledger answers again, by the run
or its supervisor, and it resumes from that checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from campaign.errors import LedgerUnreachable
from campaign.ledger import Ledger
from campaign.ledger.outage import outage_s
from campaign.loop.checkpoint_file import file_sha256
from campaign.loop.run_files import record_file


class WaitingRecords:
    """What one segment wrote that its ledger has not recorded yet: files (checkpoints,
    predictions) and phase measurements, in the order they came."""

    def __init__(self, ledger: Ledger, run_id: str) -> None:
        self.ledger, self.run_id = ledger, run_id
        # ("file", kind, path, step, sha256) or ("phases", rows), oldest first
        self.pending: list[tuple[Any, ...]] = []

    def file(self, kind: str, path: Path, step: int, lease: str | None,
             sha256: str | None = None) -> None:
        """Record a file the run wrote now if the ledger answers, else keep it and go on."""
        self.pending.append(("file", kind, path, step, sha256 or file_sha256(path)))
        self.flush(lease, patient=False)

    def phases(self, rows: list[dict[str, Any]], lease: str | None) -> None:
        """Record phase measurements now if the ledger answers, else keep them and go on."""
        self.pending.append(("phases", rows))
        self.flush(lease, patient=False)

    def flush(self, lease: str | None, *, patient: bool = True) -> None:
        """Write what waits, oldest first; ``patient``: ride out an outage (before the run's
        end), else give up at once and keep it."""
        ledger = self.ledger if patient else self.ledger.impatient()
        while self.pending:
            item = self.pending[0]
            try:
                if item[0] == "file":
                    _, kind, path, step, sha256 = item
                    if path.exists():  # (a checkpoint pruned meanwhile needs no record)
                        record_file(ledger, self.run_id, kind, path, step, lease=lease,
                                    sha256=sha256)
                else:
                    ledger.add_phase_measurements(item[1], lease=lease)
            except LedgerUnreachable:
                if patient:
                    raise
                return
            self.pending.pop(0)


def end_if_away_too_long(metrics: Any, step: int) -> None:
    """After a checkpoint is on disk: an outage past the limit ends the run here (stop.py
    makes a LedgerUnreachable ``interrupted``/``ledger_unreachable``)."""
    away = metrics.away_s() if hasattr(metrics, "away_s") else 0.0
    limit = outage_s()
    if away > limit:
        raise LedgerUnreachable(
            f"the ledger was away for {away:.0f} s, past CAMPAIGN_LEDGER_OUTAGE_S={limit:g}: "
            f"the run stops at its checkpoint of update {step}")
