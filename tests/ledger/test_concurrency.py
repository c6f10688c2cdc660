"""Many processes on one ledger at the same time, on both engines.

These catch a deferred-transaction setup (SQLite fails at once with
"database is locked" when a read-then-write transaction loses a race) and a
migration that runs twice when processes open a fresh ledger together.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest

from campaign.ledger import Ledger, migrate
from tests.support.helpers import plan_campaign
from tests.support.raw import execute
from tests.support.workers import open_fresh, write_metrics

PROCESSES = 8
POINTS = 20_000
# One point per transaction: 8 x 5,000 contending write transactions, a read-then-write
# every 250 points (20 per process, as many as the batched test's 20,000 / 1,000).
SINGLE_POINTS = 5_000
# Forked from one server that imported tests.support.workers (and so the ledger code) once: each of
# the 48 processes is new and opens its own connections, without a second's imports each.
CONTEXT = mp.get_context("forkserver")
CONTEXT.set_forkserver_preload(["tests.support.workers"])


def _run_writers(url: str, batch_size: int, read_every: int, points: int) -> list[str]:
    with Ledger.open(url, create=True) as ledger:
        record = plan_campaign(ledger, name="stress", seeds=PROCESSES, variants={"only": 1e-4})
        claims = [ledger.claim_next("stress", f"w{i}") for i in range(PROCESSES)]
    start = CONTEXT.Barrier(PROCESSES)
    errors = CONTEXT.Queue()
    procs = [
        CONTEXT.Process(target=write_metrics, args=(url, c.run_id, c.segment_id, points,
                                                    batch_size, read_every, start, errors))
        for c in claims
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=600)
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert all(p.exitcode == 0 for p in procs), found
    assert len(record.run_ids) == PROCESSES
    return [c.run_id for c in claims]


def _assert_every_point_stored(url: str, run_ids: list[str], points: int = POINTS) -> None:
    assert execute(url, "SELECT COUNT(*) FROM metrics")[0][0] == PROCESSES * points
    per_run = dict(execute(url, "SELECT run_id, COUNT(*) FROM metrics GROUP BY run_id"))
    assert per_run == dict.fromkeys(run_ids, points)


@pytest.mark.slow
def test_eight_processes_batched_writes(ledger_url: str) -> None:
    run_ids = _run_writers(ledger_url, batch_size=1000, read_every=0, points=POINTS)
    _assert_every_point_stored(ledger_url, run_ids)


@pytest.mark.slow
def test_eight_processes_one_row_per_transaction_with_reads(ledger_url: str) -> None:
    """Every point its own transaction, reads interleaved: no "database is locked" surfaces."""
    run_ids = _run_writers(ledger_url, batch_size=1, read_every=250, points=SINGLE_POINTS)
    _assert_every_point_stored(ledger_url, run_ids, SINGLE_POINTS)


@pytest.mark.slow
def test_eight_processes_open_a_fresh_ledger(ledger_url: str) -> None:
    start = CONTEXT.Barrier(PROCESSES)
    results = CONTEXT.Queue()
    procs = [CONTEXT.Process(target=open_fresh, args=(ledger_url, start, results))
             for _ in range(PROCESSES)]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=300) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    assert outcomes == [("ok", migrate.head_revision())] * PROCESSES, outcomes
    # Migrations ran once: one version row, every table created once (a second
    # run would have failed on CREATE TABLE and surfaced above).
    assert execute(ledger_url, "SELECT version_num FROM alembic_version") == [
        (migrate.head_revision(),)
    ]
