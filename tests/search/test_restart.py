"""A launcher stopped mid-search and started again proposes the same next variants: a cohort
is proposed from the results of the cohorts before it alone, with a seeded sampler, so the
timing of a restart changes nothing."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from campaign.ledger import Ledger
from tests.search.specs import TPE, plan_and_pilot, write_spec
from tests.support.launch_helpers import ROOT, cli, invoke, wait_for


def _proposals(ledger: Ledger, name: str) -> list[dict[str, object]]:
    events = ledger.events(name)
    return [json.loads(d) for d in events[events["kind"] == "search_proposal"]["detail"]]


def _completed(ledger: Ledger, name: str) -> int:
    runs = ledger.runs(name)
    return int((runs["status"] == "completed").sum())


@pytest.mark.slow
def test_a_launcher_stopped_mid_search_proposes_the_same_next_variants(
    tmp_path: Path, sqlite_url: str, sqlite_ledger: Ledger, postgresql_url: str,
    postgresql_ledger: Ledger,
) -> None:
    import subprocess

    for url in (sqlite_url, postgresql_url):
        spec = write_spec(tmp_path, "tpe-search", search=TPE)
        plan_and_pilot(url, spec, "tpe-search", tmp_path / "pilots")
    # Uninterrupted on SQLite.
    done = invoke(sqlite_url, "launch", "tpe-search", "--workers", "2", "--artifacts",
                  str(tmp_path / "a"), "--no-replay-check")
    assert done.returncode == 0, done.stderr[-3000:]
    whole = _proposals(sqlite_ledger, "tpe-search")
    assert [p["cohort"] for p in whole] == [0, 0, 0, 1, 1, 1]
    assert {p["sampler"] for p in whole} == {"tpe"}

    # On PostgreSQL: the launcher is stopped while the first cohort trains, then started
    # again; the second cohort is proposed by the second launcher.
    launcher = subprocess.Popen(
        [*cli(postgresql_url, "launch", "tpe-search", "--workers", "2", "--artifacts",
              str(tmp_path / "b"), "--no-replay-check")],
        cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: _completed(postgresql_ledger, "tpe-search") >= 4, 600,
             "part of the first cohort to complete")
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode != 0, stderr[-2000:]
    assert [p["cohort"] for p in _proposals(postgresql_ledger, "tpe-search")] == [0, 0, 0]
    time.sleep(0.1)
    done = invoke(postgresql_url, "launch", "tpe-search", "--workers", "2", "--artifacts",
                  str(tmp_path / "b"), "--no-replay-check", "--resume-interrupted")
    assert done.returncode == 0, done.stderr[-3000:]
    again = _proposals(postgresql_ledger, "tpe-search")
    assert [(p["variant"], p["params"]) for p in again] == [
        (p["variant"], p["params"]) for p in whole]
    # The conclusions drawn are the same too: the same variant confirmed.
    events = postgresql_ledger.events("tpe-search")
    chosen = json.loads(events[events["kind"] == "search_confirmation"]["detail"].iloc[0])
    first = sqlite_ledger.events("tpe-search")
    assert chosen["chosen"] == json.loads(
        first[first["kind"] == "search_confirmation"]["detail"].iloc[0])["chosen"]
