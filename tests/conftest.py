"""Fixtures: one ledger URL fixture parametrised over SQLite and the real PostgreSQL.

PostgreSQL is never skipped: if the server named by ``CAMPAIGN_TEST_POSTGRES``
(default: the local trust-auth server, database ``test``) cannot be reached,
the PostgreSQL half of the suite fails with a message saying so. Each test
gets its own database, created and dropped here.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from campaign.ledger import Ledger

POSTGRES_ADMIN_URL = os.environ.get(
    "CAMPAIGN_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"
)
BACKENDS = ("sqlite", "postgresql")


def _admin_connection() -> psycopg.Connection:
    try:
        return psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as error:
        pytest.fail(
            f"PostgreSQL for the ledger tests is unreachable at {POSTGRES_ADMIN_URL} "
            f"(set CAMPAIGN_TEST_POSTGRES; .ci/run starts the local server): {error}",
            pytrace=False,
        )


@pytest.fixture
def postgresql_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this test; dropped afterwards."""
    name = f"campaign_test_{uuid.uuid4().hex[:12]}"
    with _admin_connection() as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    try:
        yield f"{base}/{name}"
    finally:
        with _admin_connection() as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture(params=BACKENDS)
def ledger_url(request: pytest.FixtureRequest) -> str:
    """An empty ledger location on each engine (nothing created yet)."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    """A ledger created at head on each engine."""
    with Ledger.open(ledger_url, create=True) as opened:
        yield opened


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` need a CUDA device: skipped by capability where there is none."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="capability: no CUDA device on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def sqlite_ledger(sqlite_url: str) -> Iterator[Ledger]:
    """A ledger at head on SQLite only (for behaviour that does not depend on the engine)."""
    with Ledger.open(sqlite_url, create=True) as opened:
        yield opened


@pytest.fixture
def postgresql_ledger(postgresql_url: str) -> Iterator[Ledger]:
    """A ledger at head on PostgreSQL only (the engine that several machines share)."""
    with Ledger.open(postgresql_url, create=True) as opened:
        yield opened


# Set by `make test` (and so by CI): every optional capability the suite can exercise is
# installed there, so a missing one is a failure, never a silent skip.
REQUIRE_ALL = bool(os.environ.get("CAMPAIGN_REQUIRE_ALL"))


def require(module: str, extra: str) -> object:
    """Import an optional engine for a test module: skipped by capability where it is not
    installed, an error where the suite was told everything is there."""
    if REQUIRE_ALL:
        return __import__(module)
    return pytest.importorskip(module, reason=f"capability: the {extra} extra is not installed")
