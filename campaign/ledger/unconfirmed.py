"""Metric batches the server acknowledged but may not have on disk yet (PostgreSQL).

Metric transactions commit with ``synchronous_commit = off`` (dialects.py): the server answers
before its write-ahead log reaches the disk, and flushes it within about 0.6 s. A server that
crashes or is stopped with ``-m immediate`` in that window forgets the batch although the
writer was told it was stored: points lost without a word. So the writer keeps each batch
until the log is known to be on disk past it, and writes it again (idempotently, on
(segment, key, step)) when it cannot know: its connection was lost, or the server restarted
under a pooler that hid the restart.

How it knows, without a round trip of its own: each flush's transaction first reads the
server's start time and two positions of its log, the end written so far (which lies past
every earlier batch's commit) and the end flushed to disk. A batch is confirmed once a later
flush finds the flushed end past the written end recorded after it.
"""

from __future__ import annotations

from typing import Any

POSITIONS = (
    "SELECT pg_postmaster_start_time()::text, "
    "(pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint, "
    "(pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint"
)


class UnconfirmedBatches:
    """The batches a writer keeps until the server's log on disk covers them."""

    def __init__(self) -> None:
        self._batches: list[tuple[list[Any], int | None]] = []  # (rows, a log position past)
        self._server: str | None = None
        self._confirmed = 0  # leading batches the transaction in flight found on disk
        self._again: list[Any] = []  # rows the transaction in flight writes again
        self.uncertain = False  # a flush failed: whatever it kept is written again

    def rows(self) -> list[Any]:
        """Every kept row."""
        return [row for rows, _ in self._batches for row in rows]

    def before_insert(self, cursor: Any) -> list[Any]:
        """Inside a flush's transaction, before its insert: the kept rows it must write again
        (after a failure, or when the server restarted since they were written)."""
        cursor.execute(POSITIONS)
        started, flushed, written = cursor.fetchone()
        restarted = self._server is not None and started != self._server
        self._server = started
        if self.uncertain or restarted:
            self._confirmed, self._again = len(self._batches), self.rows()
            return self._again
        self._batches = [(rows, written if past is None else past)
                         for rows, past in self._batches]
        self._confirmed = next((i for i, (_, past) in enumerate(self._batches)
                                if past is None or past > flushed), len(self._batches))
        self._again = []
        return []

    def committed(self, rows: list[Any], durable: bool = False) -> None:
        """The flush's transaction committed ``rows`` (and what it wrote again); ``durable``:
        synchronously, so the log is on disk past every batch kept."""
        del self._batches[: self._confirmed]
        if durable:
            self._batches = []
        else:
            self._batches.append((self._again + rows, None))
        self._confirmed, self._again, self.uncertain = 0, [], False
