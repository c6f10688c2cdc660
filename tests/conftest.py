"""Fixtures: one ledger URL fixture parametrised over SQLite and the real PostgreSQL.

PostgreSQL is never skipped: if the server named by ``CAMPAIGN_TEST_POSTGRES``
(default: the local trust-auth server, database ``test``) cannot be reached,
the PostgreSQL half of the suite fails with a message saying so. Each test
gets its own database, created and dropped here.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from campaign.ledger import Ledger

# torch single-threaded in each test process, and so in everything it starts (which inherits
# the setting), unless the caller chose: the suite runs three test processes on two cores,
# where a second OpenMP thread per process spins while it waits for a core (measured: the
# data-gate, loop-option, optimizer and replica tests took 93 CPU-s with torch's default of
# two threads, 54 CPU-s with one; 70 s and 50 s of wall time). Set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Fixtures of a private ledger server to restart and crash (outage tests of several packages).
pytest_plugins = ["tests.support.outages"]

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


# The fixtures that give a ledger at head: their test's database is made from the template at
# once, not made empty, dropped and made again (each CREATE DATABASE writes about 5 MiB).
AT_HEAD_FIXTURES = frozenset({"ledger", "postgresql_ledger"})
_from_template: set[str] = set()  # the URLs of databases made from this process's template


@pytest.fixture
def postgresql_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh PostgreSQL database for this test, dropped afterwards: empty, or a copy of the
    migrated template where the test asks for a ledger at head."""
    name = f"campaign_test_{uuid.uuid4().hex[:12]}"
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    at_head = not AT_HEAD_FIXTURES.isdisjoint(request.fixturenames)
    if at_head:
        template = request.getfixturevalue("_postgresql_template")
        create = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template))
    with _admin_connection() as admin:
        admin.execute(create)
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    url = f"{base}/{name}"
    if at_head:
        _from_template.add(url)
    try:
        yield url
    finally:
        with _admin_connection() as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        _from_template.discard(url)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture(params=BACKENDS)
def ledger_url(request: pytest.FixtureRequest) -> str:
    """An empty ledger location on each engine (nothing created yet)."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SQLite ledger migrated to head per test process; each test's ledger is a copy
    (migrating takes about half a second, a copy a millisecond)."""
    path = tmp_path_factory.mktemp("template") / "ledger.db"
    Ledger.open(f"sqlite:///{path}", create=True).close()
    return path


@pytest.fixture(scope="session")
def _postgresql_template() -> Iterator[str]:
    """One PostgreSQL database migrated to head per test process, the TEMPLATE of each test's
    ledger database; dropped at the end."""
    name = f"campaign_template_{uuid.uuid4().hex[:12]}"
    with _admin_connection() as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    Ledger.open(f"{base}/{name}", create=True).close()
    try:
        yield name
    finally:
        with _admin_connection() as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _at_head(request: pytest.FixtureRequest, url: str) -> str:
    """Make the empty ledger location ``url`` a ledger at head, from this process's template."""
    if url.startswith("sqlite:///"):
        shutil.copyfile(request.getfixturevalue("_sqlite_template"), url.removeprefix("sqlite:///"))
        return url
    if url in _from_template:
        return url
    template = request.getfixturevalue("_postgresql_template")
    name = url.rsplit("/", 1)[1]
    with _admin_connection() as admin:
        admin.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template)))
    return url


@pytest.fixture
def ledger(request: pytest.FixtureRequest, ledger_url: str) -> Iterator[Ledger]:
    """A ledger at head on each engine."""
    with Ledger.open(_at_head(request, ledger_url)) as opened:
        yield opened


# The slowest tests that keep the cores busy (from `--durations`), scheduled first. With
# `--dist worksteal` they fall in the first worker's share, which runs them one after the
# other while the other workers take the light tests and steal the rest of its queue: each
# of these trains or starts hosts of its own, and three at once oversubscribe two cores
# (measured: 16 min 24 s this way, 19+ min with them spread one per worker).
SLOWEST_FIRST = (
    "tests/host/test_torch_imports.py::",
    "tests/launch/test_ray_executor.py::",
    "tests/tasks/test_causal_lm.py::test_the_llm_demo_compares_full_and_lora_with_conclusions",
    "tests/packaging/test_wheel.py::",
    "tests/serve/test_serve_browser.py::",
    "tests/ledger/test_concurrency.py::",
    "tests/loop/test_lazy_data.py::test_ten_million_lazy_examples",
    "tests/tasks/test_causal_lm.py::test_lora_trains_and_saves_only_its_adapter",
    "tests/tasks/test_hf_parity.py::",
    "tests/launch/test_launch.py::test_workers_execute_every_run_exactly_once",
    "tests/pilot/test_gate_classes.py::",
    "tests/cli/test_demo.py::",
    "tests/loop/test_task_base.py::test_the_readme_steps_for_your_own_task",
    "tests/loop/test_loader.py::",
    "tests/launch/test_launch.py::",
    "tests/loop/test_loop_exact.py::",
    "tests/ledger/test_leases.py::",
    "tests/launch/test_signals_everywhere.py::",
    "tests/loop/test_resume_safety.py::",
)
# The slow tests that mostly wait (a SLURM job's start and its time limit, a ledger server
# stopped for seconds, an outage limit running out): each file starts the other workers'
# shares, round robin, so they wait beside the busy ones instead of after them (measured:
# see benchmarks/README.md, test suite).
SLOW_WAITING = (
    "tests/launch/test_slurm_cluster.py::",
    "tests/launch/test_killed_in_outage.py::",
    "tests/ledger/test_outage.py::",
    "tests/ledger/test_pooled_outage.py::",
)


def _rank(item: pytest.Item, prefixes: tuple[str, ...]) -> int:
    return next((i for i, p in enumerate(prefixes) if item.nodeid.startswith(p)), len(prefixes))


def _scheduled(items: list[pytest.Item], workers: int) -> list[pytest.Item]:
    """``items`` in the order whose contiguous shares `--dist worksteal` hands the workers
    (as its scheduler cuts them): the busy slow tests in the first share, the waiting slow
    ones at the head of the others, the rest after them in their own order."""
    busy = sorted((i for i in items if _rank(i, SLOWEST_FIRST) < len(SLOWEST_FIRST)),
                  key=lambda i: _rank(i, SLOWEST_FIRST))
    waiting = [i for i in items if i not in busy and _rank(i, SLOW_WAITING) < len(SLOW_WAITING)]
    rest = [i for i in items if i not in busy and i not in waiting]
    if workers < 2:
        return busy + sorted(waiting, key=lambda i: _rank(i, SLOW_WAITING)) + rest
    shares: list[list[pytest.Item]] = [busy] + [[] for _ in range(workers - 1)]
    for n in range(len(SLOW_WAITING)):
        shares[1 + n % (workers - 1)] += [i for i in waiting if _rank(i, SLOW_WAITING) == n]
    left = len(items)
    for k, share in enumerate(shares):
        size = left // (workers - k)
        while len(share) < size and rest:
            share.append(rest.pop(0))
        left -= size
    return [item for share in shares for item in share] + rest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tests placed (:func:`_scheduled`); tests marked ``gpu`` need a CUDA device:
    skipped by capability where there is none."""
    items[:] = _scheduled(items, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="capability: no CUDA device on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def sqlite_ledger(request: pytest.FixtureRequest, sqlite_url: str) -> Iterator[Ledger]:
    """A ledger at head on SQLite only (for behaviour that does not depend on the engine)."""
    with Ledger.open(_at_head(request, sqlite_url)) as opened:
        yield opened


@pytest.fixture
def postgresql_ledger(request: pytest.FixtureRequest, postgresql_url: str) -> Iterator[Ledger]:
    """A ledger at head on PostgreSQL only (the engine that several machines share)."""
    with Ledger.open(_at_head(request, postgresql_url)) as opened:
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
