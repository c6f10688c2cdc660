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

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from campaign.errors import LedgerUnreachable
from campaign.ledger import Ledger
from campaign.ledger.evidence import Mark
from campaign.ledger.outage import outage_s
from campaign.ledger.reach_probe import probe_for
from campaign.loop.checkpoint_file import file_sha256
from campaign.loop.run_files import record_file

WAITING_NAME = "waiting-records.json"  # beside the spill file, while records wait


class WaitingRecords:
    """What one segment wrote that its ledger has not recorded yet: files (checkpoints,
    predictions) and phase measurements, in the order they came. While any wait they are also
    in the run folder's ``waiting-records.json``: a run's process that dies in the outage
    leaves them to its supervisor, or to the next worker (:func:`record_left_waiting`).
    Each keeps the mark of its first attempt, so an attempt whose COMMIT was lost with its
    connection is recognised by the next, never recorded twice."""

    def __init__(self, ledger: Ledger, run_id: str, folder: Path | None = None,
                 lease: str | None = None) -> None:
        self.ledger, self.run_id, self.lease = ledger, run_id, lease
        self.kept = None if folder is None else folder / WAITING_NAME
        # {"file": kind, "path", "step", "sha256", "mark"} or {"phases": rows, "mark"}
        self.pending: list[dict[str, Any]] = []

    def file(self, kind: str, path: Path, step: int, lease: str | None,
             sha256: str | None = None) -> None:
        """Record a file the run wrote now if the ledger answers, else keep it and go on."""
        self.pending.append({"file": kind, "path": str(path), "step": step,
                             "sha256": sha256 or file_sha256(path), "mark": None})
        self.flush(lease, patient=False)

    def phases(self, rows: list[dict[str, Any]], lease: str | None) -> None:
        """Record phase measurements now if the ledger answers, else keep them and go on."""
        self.pending.append({"phases": rows, "mark": None})
        self.flush(lease, patient=False)

    def flush(self, lease: str | None, *, patient: bool = True) -> None:
        """Write what waits, oldest first; ``patient``: ride out an outage (before the run's
        end), else give up at once and keep it (in the run folder too)."""
        self.lease = lease
        ledger = self.ledger if patient else self.ledger.impatient()
        probe = probe_for(self.ledger.engine)
        if not patient and self.pending and not probe.worth_trying():
            self._keep()  # a server that does not answer: asked from a thread meanwhile
            return
        on_disk = self.kept is not None and self.kept.exists()
        try:
            while self.pending:
                _record(ledger, self.run_id, self.pending[0], lease)
                self.pending.pop(0)
                if on_disk and self.pending:  # a kill now must not record it again
                    self._keep()
        except LedgerUnreachable:
            self._keep()
            probe.went_away()
            if patient:
                raise
            return
        if self.kept is not None:
            self.kept.unlink(missing_ok=True)

    def _keep(self) -> None:
        """Keep what waits in the run folder too; a volume that cannot take it (full) costs
        only that copy, never the run: the records still wait in memory."""
        if self.kept is None:
            return
        with contextlib.suppress(OSError):
            self.kept.parent.mkdir(parents=True, exist_ok=True)
            partial = self.kept.with_suffix(".partial")
            partial.write_text(json.dumps({"run_id": self.run_id, "lease": self.lease,
                                           "pending": self.pending}))
            os.replace(partial, self.kept)


def record_left_waiting(ledger: Ledger, folder: Path, run_id: str, lease: str | None) -> None:
    """Record what a run's process left waiting in ``folder`` when it ended in an outage (its
    supervisor, before the run's end; or the next worker, with the end it left). Riding out.
    Records left under another lease (an earlier segment's) are not this one's to write: the
    file goes. One whose first attempt left no mark may have committed before its process
    died: it is looked for in the whole table first, so it is never recorded twice."""
    kept = folder / WAITING_NAME
    try:
        document = json.loads(kept.read_text())
        pending = [dict(item) for item in document["pending"]]
        left_by, left_under = document["run_id"], document.get("lease")
    except (OSError, ValueError, KeyError, TypeError):  # none, or not ours to read
        return
    if left_by != run_id:
        return
    if left_under != lease:
        kept.unlink(missing_ok=True)
        return
    for item in pending:
        item["mark"] = 0 if item.get("mark") is None else item["mark"]
    waiting = WaitingRecords(ledger, run_id, folder, lease)
    waiting.pending = pending
    waiting.flush(lease)


def _record(ledger: Ledger, run_id: str, item: dict[str, Any], lease: str | None) -> None:
    """One waiting record, under the mark of its first attempt (kept in ``item``)."""
    mark = Mark()
    mark.id = item["mark"]
    try:
        if "file" in item:
            path = Path(item["path"])
            if path.exists():  # (a checkpoint pruned meanwhile needs no record)
                record_file(ledger, run_id, item["file"], path, int(item["step"]),
                            lease=lease, sha256=item["sha256"], mark=mark)
        else:
            ledger.add_phase_measurements(item["phases"], lease=lease, mark=mark)
    finally:
        item["mark"] = mark.id


def end_if_away_too_long(metrics: Any, step: int) -> None:
    """After a checkpoint is on disk: an outage past the limit ends the run here (stop.py
    makes a LedgerUnreachable ``interrupted``/``ledger_unreachable``)."""
    away = metrics.away_s() if hasattr(metrics, "away_s") else 0.0
    limit = outage_s()
    if away > limit:
        raise LedgerUnreachable(
            f"the ledger was away for {away:.0f} s, past CAMPAIGN_LEDGER_OUTAGE_S={limit:g}: "
            f"the run stops at its checkpoint of update {step}")
