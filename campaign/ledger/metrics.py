"""The metric writer: buffer points on the caller's side, flush them in one transaction.

Logging must never dominate a training step. ``log`` appends a tuple to a
list (a few microseconds); a flush sends the whole buffer in one
transaction with the driver's fastest bulk path (``executemany`` on SQLite,
``COPY`` on PostgreSQL), which is what one would write by hand.
SQLAlchemy's compiled insert of dicts is skipped on purpose: it reaches
under half of the driver's speed (benchmarks/ingest.py).

Flushes happen when the buffer reaches ``batch_size`` points, when a ``log``
call finds the last flush older than ``interval_s``, on ``flush()`` and on
``close()``. Writes are idempotent on (segment, key, step): a flush retried
after a lost connection cannot duplicate a point. A writer opened with a
lease (see :mod:`.leases`) checks it in every flush's transaction: once the
run was declared lost or reclaimed, the flush raises :class:`LeaseLost`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, exc

from campaign.errors import LeaseLost, LedgerError, LedgerUnreachable, RefusedWrite
from campaign.ledger.closing import Closing
from campaign.ledger.connections import (
    REFUSAL_PREFIX,
    Retries,
    bulk_metric_connection,
    is_driver_error,
    translate_error,
    wrapped_driver_error,
)
from campaign.ledger.dialects import (
    insert_metric_rows,
    metric_insert_sql,
    metric_transaction_prelude,
    placeholder,
    share_lock,
)
from campaign.ledger.outage import FIRST_WAIT_S, LONGEST_WAIT_S, answered, came_back, outage_s
from campaign.ledger.reach_probe import probe_for
from campaign.ledger.spill import KEEP_IN_MEMORY, SpillFile
from campaign.ledger.unconfirmed import UnconfirmedBatches

MetricRow = tuple[str, int, str, int, float | None, int | None, float]


class Away:
    """A keep-going writer's view of an outage: since when, and when to try again (0.25 s
    doubling to 5 s, as a transaction's backoff)."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.next_try, self.wait_s = 0.0, FIRST_WAIT_S

    def missed(self) -> None:
        now = time.monotonic()
        self.since = now if self.since is None else self.since
        self.next_try = now + self.wait_s
        self.wait_s = min(self.wait_s * 2, LONGEST_WAIT_S)


class MetricWriter(Closing):
    """Buffered writer of one segment's metric points. Not thread-safe: one per loop."""

    def __init__(
        self,
        engine: Engine,
        run_id: str,
        segment_id: int,
        *,
        batch_size: int = 1000,
        interval_s: float = 5.0,
        lease: str | None = None,
        spill: Path | None = None,
    ) -> None:
        if batch_size < 1 or interval_s <= 0:
            raise ValueError("batch_size must be >= 1 and interval_s > 0")
        self._engine = engine
        self._sql = metric_insert_sql(engine.dialect.name)
        self._dialect = engine.dialect.name
        self._prelude = metric_transaction_prelude(engine.dialect.name)
        self._durable_prelude = metric_transaction_prelude(engine.dialect.name, durable=True)
        mark = placeholder(engine.dialect.name)
        self._segment_check = f"SELECT 1 FROM segments WHERE id = {mark} AND run_id = {mark}"
        self._lease_check = (
            f"SELECT 1 FROM segments s JOIN runs r ON r.id = s.run_id WHERE s.id = {mark} "
            f"AND r.id = {mark} AND r.status = 'running' AND r.lease_token = {mark}"
            + share_lock(engine.dialect.name, "r")
        )
        self.lease = lease
        self.run_id = run_id
        self.segment_id = segment_id
        self.batch_size = batch_size
        self.interval_s = interval_s
        self._buffer: list[MetricRow] = []
        self._last_flush = time.time()
        self._raw: Any = None
        self.points_written = 0
        # PostgreSQL acknowledges a metric batch before its log is on disk (unconfirmed.py)
        self._unconfirmed = UnconfirmedBatches() if self._dialect == "postgresql" else None
        # A run's writer keeps going through an outage (spill.py); None: a flush waits it out
        self._spill = None if spill is None else SpillFile(spill)
        self._away = Away()

    # -- logging (the hot path) -------------------------------------------------

    def log(
        self,
        key: str,
        step: int,
        value: float,
        examples_seen: int | None = None,
        wall_time: float | None = None,
    ) -> None:
        """Buffer one point. ``float(value)`` syncs a CUDA tensor: pass a number."""
        now = time.time() if wall_time is None else wall_time
        number = float(value)
        # NaN is stored as NULL on both engines (SQLite cannot store NaN);
        # pandas reads NULL back as NaN, so a diverged curve reads the same.
        self._buffer.append(
            (self.run_id, self.segment_id, key, step, None if number != number else number,
             examples_seen, now)
        )
        if len(self._buffer) >= self.batch_size or now - self._last_flush >= self.interval_s:
            self.flush()

    def log_dict(
        self, step: int, values: Mapping[str, float], examples_seen: int | None = None
    ) -> None:
        """Buffer several keys measured at the same step."""
        now = time.time()
        for key, value in values.items():
            self.log(key, step, value, examples_seen, now)

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def pending_rows(self) -> list[list[Any]]:
        """The buffered points as (key, step, value, examples_seen, wall_time) lists (for JSON)."""
        return [
            [key, step, value, seen, wall] for _, _, key, step, value, seen, wall in self._buffer
        ]

    # -- flushing ---------------------------------------------------------------

    def flush(self) -> int:
        """Write every buffered point in one transaction; return how many. A writer that
        keeps going (``spill``) writes nothing while its ledger is away, and does not wait."""
        self._last_flush = time.time()
        if self._spill is None:
            return self._send(self._buffer)
        if self._away.since is not None and (time.monotonic() < self._away.next_try
                                             or not probe_for(self._engine).worth_trying()):
            self._bound()  # (a server that does not answer is asked from a thread meanwhile)
            return 0
        try:
            written = (self._send_spilled(0.0, keep_foreign=False)
                       + self._send(self._buffer, 0.0))
        except LedgerUnreachable:  # an outage, a full or read-only file: keep the points
            self._went_away()
            return 0
        self._away = Away()
        return written

    def write_spilled(self) -> int:
        """Write the spill file's points now, riding out an outage (a supervisor, before the
        end it writes for a run whose process could not: its segment is still open); then
        make every batch written so far durable (:meth:`_send`, ``durable``)."""
        written = self._send_spilled(None)
        self._send([], None, keep=True, durable=True)
        return written

    def adopt_spilled(self, up_to_step: int) -> None:
        """A resumed segment takes over the points an ended segment left in the spill file
        (its ledger went away and never came back for it), up to the update it resumes from:
        the later ones it trains again."""
        if not self._spill:
            return
        kept = [(self.run_id, self.segment_id, *row[2:])
                for batch in self._spill.batches(self.batch_size) for row in batch
                if row[1] == self.segment_id or row[3] <= up_to_step]
        self._spill.remove()
        if kept:
            self._spill.append(kept)

    def away_s(self) -> float:
        """How long this writer has found its ledger away (0 when it is not)."""
        return 0.0 if self._away.since is None else time.monotonic() - self._away.since

    def _went_away(self) -> None:
        self._drop_connection()
        if self._unconfirmed is not None:  # the server may lose what it acknowledged
            self._unconfirmed.uncertain = True
        self._away.missed()
        probe_for(self._engine).went_away()
        self._bound()

    def _bound(self) -> None:
        """Past KEEP_IN_MEMORY points, the buffer goes to the run folder's spill file."""
        if self._spill is not None and len(self._buffer) >= KEEP_IN_MEMORY:
            self._spill.append(self._buffer)
            self._buffer = []

    def _send_spilled(self, outage_s: float | None, keep_foreign: bool = True) -> int:
        """Write the spill file's points of this segment; another segment's are never written
        under it. They stay in the file for the next resume to adopt (:meth:`adopt_spilled`):
        a process that died may have died before adopting an ended segment's. Not while the
        segment trains (``keep_foreign`` False): it adopted at its resume, so another's now are
        a process's whose lease is gone, dropped rather than read again at every flush."""
        if not self._spill:
            return 0
        written, foreign = 0, []
        for batch in self._spill.batches(self.batch_size):
            foreign += [row for row in batch if row[1] != self.segment_id]
            written += self._send([row for row in batch if row[1] == self.segment_id],
                                  outage_s, keep=True)
        self._spill.remove()
        if foreign and keep_foreign:
            self._spill.append(foreign)
        return written

    def _send(self, rows: list[MetricRow], outage_s: float | None = None,
              keep: bool = False, durable: bool = False) -> int:
        """One transaction of ``rows``; ``outage_s``: how long to ride out an outage (None:
        the engine's patience). Clears the buffer unless ``keep``. ``durable`` (the writer's
        last write, before its run's end is recorded): a synchronous COMMIT, even of no rows,
        so every batch acknowledged earlier is on disk, or written again if the server
        restarted meanwhile; no later flush is left to find them lost (unconfirmed.py)."""
        if not rows and not (durable and self._unconfirmed is not None
                             and self._unconfirmed.rows()):
            return 0
        retries = Retries(self._engine)
        if outage_s is not None:
            retries.outage.budget_s = outage_s
        while True:
            try:
                self._write(rows, durable)
                break
            except Exception as error:
                self._drop_connection()
                # Connecting goes through SQLAlchemy (wrapped errors); the batch itself goes
                # through the driver (raw sqlite3/psycopg errors): one path for both.
                if isinstance(error, exc.DBAPIError):
                    wrapped = error
                elif is_driver_error(error):  # its own class (a lost connection's too)
                    wrapped = wrapped_driver_error(self._engine, error, self._sql)
                else:
                    raise
                if retries.again(wrapped):
                    if self._unconfirmed is not None:  # the server may have lost what it had
                        self._unconfirmed.uncertain = True
                    continue
                raise translate_error(wrapped, self._engine.url, "writing metrics") from error
        if retries.outage.waited:
            came_back()
        else:
            answered()
        if not keep:
            self._buffer = []
        self.points_written += len(rows)
        return len(rows)

    def _close_kept(self) -> None:
        left = max(0.0, outage_s() - self.away_s())
        try:
            self._send_spilled(left)
            self._send(self._buffer, left, durable=True)
        except LeaseLost:
            raise  # another segment owns the run now: nothing of this one is kept
        except LedgerError:
            if self._spill is not None and self._buffer:
                self._spill.append(self._buffer)
                self._buffer = []
            raise

    def _write(self, rows: list[MetricRow], durable: bool = False) -> None:
        raw = self._connection()
        cursor = raw.cursor()
        try:
            for statement in (self._durable_prelude if durable else self._prelude):
                cursor.execute(statement)
            if self.lease is not None:
                cursor.execute(self._lease_check, (self.segment_id, self.run_id, self.lease))
                if cursor.fetchone() is None:
                    raise LeaseLost(
                        f"writing metrics: run {self.run_id}: this worker's lease is gone "
                        "(the run was declared lost or taken by another worker); "
                        "its writes are refused"
                    )
            cursor.execute(self._segment_check, (self.segment_id, self.run_id))
            if cursor.fetchone() is None:
                raise RefusedWrite(
                    f"writing metrics: {REFUSAL_PREFIX}: segment {self.segment_id} "
                    f"is not a segment of run {self.run_id}"
                )
            again = [] if self._unconfirmed is None else self._unconfirmed.before_insert(cursor)
            if again or rows:
                insert_metric_rows(self._dialect, cursor, again + rows)
            raw.commit()
            if self._unconfirmed is not None:
                self._unconfirmed.committed(rows, durable)
        except BaseException:
            with contextlib.suppress(Exception):  # a lost connection cannot roll back: the
                raw.rollback()  # error that lost it is the one to report
            raise
        finally:
            with contextlib.suppress(Exception):
                cursor.close()

    def _connection(self) -> Any:
        if self._raw is None:
            self._raw = bulk_metric_connection(self._engine)
        return self._raw.driver_connection

    def _drop_connection(self) -> None:
        if self._raw is not None:
            try:
                self._raw.invalidate()
            finally:
                self._raw = None

    def close(self) -> None:
        """Flush what is left and give the connection back to the pool. A writer that keeps
        going waits out what is left of the outage limit, then leaves its points in the spill
        file (its supervisor writes them before the run's end) and raises."""
        try:
            if self._spill is None:
                self._last_flush = time.time()
                self._send(self._buffer, durable=True)
            else:
                self._close_kept()
        finally:
            if self._raw is not None:
                self._raw.close()
                self._raw = None

