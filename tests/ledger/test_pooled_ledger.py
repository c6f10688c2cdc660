"""A ledger behind PgBouncer in transaction mode (scripts/pgbouncer, Debian's package), as a
team shares one when its workers outnumber the server's max_connections: migrations, atomic
claims, leases, metric writes and reads all work when consecutive transactions of one client
connection run on different server connections (no server-side prepared statement, no
session state)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from campaign.ledger import Ledger
from tests.conftest import REQUIRE_ALL
from tests.support.launch_helpers import event_counts, invoke
from tests.support.loop_helpers import plan_quick

pytestmark = pytest.mark.engine

BOUNCER_PORT = 6432


@pytest.fixture
def pooled_url(postgresql_url: str) -> str:
    """The test's database, reached through PgBouncer."""
    ready = subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(BOUNCER_PORT)],
                           check=False)
    if ready.returncode != 0:
        message = f"no PgBouncer on 127.0.0.1:{BOUNCER_PORT} (scripts/pgbouncer start)"
        if REQUIRE_ALL:
            pytest.fail(message)
        pytest.skip(f"capability: {message}")
    return postgresql_url.replace(":5432/", f":{BOUNCER_PORT}/")


@pytest.mark.slow
def test_workers_share_a_ledger_through_pgbouncer_in_transaction_mode(
    pooled_url: str, tmp_path: Path
) -> None:
    with Ledger.open(pooled_url, create=True) as ledger:  # migrations through the pooler
        run_ids = plan_quick(ledger, "pooled", runs=12, updates=3)
        done = invoke(pooled_url, "launch", "pooled", "--workers", "3", "--artifacts",
                      str(tmp_path / "art"), "--no-replay-check", "--skip-pilot", "--reason",
                      "pooler test")
        assert done.returncode == 0, done.stderr[-2000:]
        runs = ledger.runs("pooled")
        assert sorted(runs["run_id"]) == sorted(run_ids) and set(runs["status"]) == {"completed"}
        counts = event_counts(ledger, "pooled")
        assert (counts["running"] == 1).all() and (counts["completed"] == 1).all()
        points = ledger.metrics("pooled", all_segments=True)
        assert not points.duplicated(["segment_id", "key", "step"]).any()
        assert len(points[points["key"] == "train/loss"]) == 12 * 3
        assert runs["worker"].nunique() > 1


def test_no_session_state_a_pooler_would_lose(postgresql_url: str, pooled_url: str) -> None:
    """What transaction pooling breaks, checked directly: a ledger connection never prepares a
    statement on the server (the next transaction may run elsewhere), and a reader's refusal
    to write holds per transaction, where PgBouncer dropped the session's options."""
    from sqlalchemy import text

    from campaign.ledger.reads import LedgerReader

    with Ledger.open(postgresql_url, create=True) as ledger:
        plan_quick(ledger, "prepared", runs=2)
        with ledger.engine.connect() as connection:
            for _ in range(12):  # psycopg prepares a statement after 5 executions by default
                connection.execute(text("SELECT count(*) FROM runs WHERE status = :s"),
                                   {"s": "planned"})
            held = connection.execute(text("SELECT count(*) FROM pg_prepared_statements"))
            assert held.scalar_one() == 0
    reader = LedgerReader.open(pooled_url)
    try:
        assert len(reader.runs("prepared")) == 2
        with pytest.raises(Exception, match="read-only transaction"), reader.engine.begin() as c:
            c.execute(text("UPDATE campaigns SET question = 'rewritten'"))
    finally:
        reader.engine.dispose()
