"""The ledger's writes of evidence around runs: events, notes, artifacts, pilots and phase
measurements, each one transaction (the base of :class:`campaign.ledger.store.Ledger`, which
adds opening, planning and the run lifecycle). Also the row helpers both use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection, Table, insert, select, update

from campaign.errors import LedgerInputError, NotFound
from campaign.ledger import statements as sql
from campaign.ledger.canonical import canonical_json
from campaign.ledger.connections import Done, Settled, run_in_transaction
from campaign.ledger.leases import hold_lease
from campaign.ledger.models import Artifact, Event, Note, PhaseMeasurement, Pilot, Run
from campaign.ledger.reads import LedgerReader
from campaign.ledger.settled import last_id, row_past

_T = TypeVar("_T")
runs_t = Run.__table__
notes_t = Note.__table__
artifacts_t = Artifact.__table__
phases_t = PhaseMeasurement.__table__
pilots_t = Pilot.__table__
events_t = Event.__table__


class EvidenceWrites(LedgerReader):
    """Reads, plus the writes that record what happened to runs and pilots."""

    def _write(self, work: Callable[[Connection], _T], what: str,
               settled: Settled[_T] | None = None, unsure: bool = False) -> _T:
        """One write transaction; ``settled``: how a retry recognises that an attempt whose
        COMMIT was lost had taken effect (:mod:`campaign.ledger.settled`); ``unsure``: asked
        before the first attempt too (an earlier call's attempt may have committed)."""
        return run_in_transaction(self.engine, work, write=True, what=what, settled=settled,
                                  unsure=unsure)

    def add_event(self, campaign: str, kind: str, detail: str | None = None,
                  run_id: str | None = None, *, lease: str | None = None) -> None:
        """Append a lifecycle event (campaign-level when ``run_id`` is None)."""

        mark = Mark()

        def work(conn: Connection) -> None:
            campaign_id = self._campaign_id(conn, campaign)
            if run_id is not None:
                run_campaign(conn, run_id, campaign_id)
                hold_lease(conn, run_id, lease)
            mark.take(conn, events_t)
            record_event(conn, campaign_id, run_id, kind, detail)

        self._write(work, f"recording event {kind!r}",
                    mark.settled(events_t, run_id=run_id, kind=kind, detail=detail))

    def add_run_events(self, campaign: str, kind: str, detail: str,
                       run_ids: Sequence[str]) -> None:
        """The same event for each of ``run_ids`` (a decision that covers exactly these
        runs, such as a recorded skip of the pilot), in one transaction."""

        mark = Mark()

        def work(conn: Connection) -> None:
            campaign_id = self._campaign_id(conn, campaign)
            for run_id in run_ids:
                run_campaign(conn, run_id, campaign_id)
            mark.take(conn, events_t)
            if run_ids:
                conn.execute(sql.INSERT_EVENT, [
                    {"campaign_id": campaign_id, "run_id": r, "kind": kind, "detail": detail}
                    for r in run_ids])

        self._write(work, f"recording event {kind!r} for {len(run_ids)} runs",
                    mark.settled(events_t, run_id=run_ids[-1] if run_ids else None, kind=kind,
                                 detail=detail))

    def add_note(self, campaign: str, text: str) -> None:
        if not text.strip():
            raise LedgerInputError("a note needs text")

        mark = Mark()

        def work(conn: Connection) -> None:
            campaign_id = self._campaign_id(conn, campaign)
            mark.take(conn, notes_t)
            conn.execute(insert(notes_t).values(campaign_id=campaign_id, text=text))

        self._write(work, f"adding a note to {campaign!r}", mark.settled(notes_t, text=text))

    def add_artifact(
        self,
        run_id: str,
        kind: str,
        path: str,
        sha256: str,
        size: int,
        step: int | None = None,
        *,
        lease: str | None = None,
        mark: Mark | None = None,
    ) -> int:
        """Record a file a run produced with its SHA-256 and size; returns its id. ``mark``:
        that of an earlier call that may have committed it (a record kept through an outage)."""

        unsure = mark is not None and mark.id is not None
        mark = mark or Mark()

        def work(conn: Connection) -> int:
            run_row(conn, run_id, self.url)
            hold_lease(conn, run_id, lease)
            mark.take(conn, artifacts_t)
            return conn.execute(
                insert(artifacts_t)
                .values(run_id=run_id, kind=kind, path=path, sha256=sha256, bytes=size, step=step)
                .returning(artifacts_t.c.id)
            ).scalar_one()

        return self._write(work, f"recording an artifact of run {run_id}",
                           mark.settled(artifacts_t, run_id=run_id, kind=kind, path=path,
                                        sha256=sha256, step=step), unsure)

    def create_pilot(self, campaign: str, config_sha256: str,
                     environment: Mapping[str, Any] | None = None,
                     gate_class: str | None = None) -> int:
        """Record a pilot of the frozen spec ``config_sha256`` for one gate class."""
        stack = None if environment is None else canonical_json(dict(environment))

        mark = Mark()

        def work(conn: Connection) -> int:
            mark.take(conn, pilots_t)
            return conn.execute(
                insert(pilots_t)
                .values(campaign_id=self._campaign_id(conn, campaign),
                        config_sha256=config_sha256,
                        environment=stack, gate_class=gate_class)
                .returning(pilots_t.c.id)
            ).scalar_one()

        return self._write(work, f"recording a pilot of {campaign!r}",
                           mark.settled(pilots_t, config_sha256=config_sha256,
                                        gate_class=gate_class))

    def set_pilot_verdict(self, pilot_id: int, verdict: str) -> None:
        def work(conn: Connection) -> None:
            conn.execute(update(pilots_t).where(pilots_t.c.id == pilot_id).values(verdict=verdict))

        self._write(work, f"recording the verdict of pilot {pilot_id}")

    def add_phase_measurements(
        self, rows: Iterable[Mapping[str, Any]], *, lease: str | None = None,
        mark: Mark | None = None,
    ) -> None:
        """Insert phase measurement rows (each with ``run_id`` or ``pilot_id``); with ``lease``
        every run named must still be running under it; ``mark`` as for
        :meth:`add_artifact`."""
        prepared = []
        for row in rows:
            item = dict(row)
            if isinstance(item.get("inputs"), Mapping):
                item["inputs"] = canonical_json(dict(item["inputs"]))
            prepared.append(item)
        if not prepared:
            return

        unsure = mark is not None and mark.id is not None
        mark = mark or Mark()
        first = {k: prepared[0].get(k) for k in ("run_id", "pilot_id", "phase")}

        def work(conn: Connection) -> None:
            for run_id in sorted({r["run_id"] for r in prepared if r.get("run_id")}):
                hold_lease(conn, run_id, lease)
            mark.take(conn, phases_t)
            conn.execute(insert(phases_t), prepared)

        self._write(work, "recording phase measurements", mark.settled(phases_t, **first),
                    unsure)


class Mark:
    """The highest id of a table that an insert's attempt saw before inserting: after a COMMIT
    lost with its connection, the retry looks past it for the row (settled.row_past)."""

    def __init__(self) -> None:
        self.id: int | None = None

    def take(self, conn: Connection, table: Table) -> None:
        if self.id is None:  # the first attempt's: a retry must look past the same mark
            self.id = last_id(conn, table)

    def settled(self, table: Table, **values: Any) -> Settled[Any]:
        def check(conn: Connection) -> Done[Any] | None:
            return None if self.id is None else row_past(conn, table, self.id, **values)

        return check


def run_row(conn: Connection, run_id: str, url: str) -> Any:
    row = conn.execute(sql.RUN_ROW, {"p_run_id": run_id}).first()
    if row is None:
        raise NotFound(f"no run {run_id!r} in ledger {url}")
    return row


def run_campaign(conn: Connection, run_id: str, campaign_id: int) -> None:
    owner = conn.execute(select(runs_t.c.campaign_id).where(runs_t.c.id == run_id)).scalar()
    if owner is None:
        raise NotFound(f"no run {run_id!r} in this ledger")
    if owner != campaign_id:
        raise LedgerInputError(f"run {run_id} belongs to another campaign")


def record_event(conn: Connection, campaign_id: int, run_id: str | None, kind: str,
           detail: str | None) -> None:
    conn.execute(
        sql.INSERT_EVENT,
        {"campaign_id": campaign_id, "run_id": run_id, "kind": kind, "detail": detail},
    )
