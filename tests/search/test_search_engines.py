"""A search on a real scheduler: a halving search on PostgreSQL run by a 2-task SLURM array
(the cluster `scripts/test-services` starts). Each array task is a worker that takes the
search's due steps before its claims: proposals, rungs and confirmation are written once,
and every run is claimed once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from campaign.ledger import Ledger
from tests.conftest import REQUIRE_ALL
from tests.search.specs import plan_and_pilot, write_spec
from tests.support.engine_helpers import with_password
from tests.support.launch_helpers import ROOT

if shutil.which("sbatch") is None and not REQUIRE_ALL:
    pytest.skip("capability: no SLURM cluster (scripts/test-services starts one)",
                allow_module_level=True)

SMALL = """method = "halving"
trials = 4
rungs = [10]
keep = 0.5
audit = 0.5
seed = 1
confirm = 1
confirm_seeds = [10, 11, 12]
"""


@pytest.mark.slow
@pytest.mark.engine
def test_a_halving_search_on_a_slurm_array(postgresql_ledger: Ledger, postgresql_url: str,
                                           tmp_path: Path) -> None:
    ledger = postgresql_ledger
    spec = write_spec(tmp_path, "slurm-search", search=SMALL)
    plan_and_pilot(postgresql_url, spec, "slurm-search", tmp_path / "pilots")
    env = {**os.environ, "CAMPAIGN_LEDGER": with_password(postgresql_url), "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "campaign", "launch", "slurm-search", "--executor", "slurm",
             "--workers", "2", "--artifacts", str(tmp_path / "art"), "--no-replay-check"],
            cwd=ROOT, env=env, text=True, capture_output=True, timeout=600)
    finally:
        subprocess.run(["scancel", "--name", "campaign:slurm-search"], check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = ledger.runs("slurm-search")
    assert set(runs["status"]) <= {"completed", "stopped"}
    events = ledger.events("slurm-search")
    kinds = events[events["run_id"].isna()]["kind"]
    steps = list(events[events["kind"] == "search_step"]["detail"])
    assert sorted(s for s in steps if not s.startswith("pilot round")) == [
        "confirmation", "proposals of cohort 0", "rung 10 of cohort 0"]
    # The proposals' new width was piloted once, by one of the two tasks.
    assert [s for s in steps if s.startswith("pilot round")] == ["pilot round 1"]
    assert len(ledger.pilots("slurm-search")) == 2
    assert (kinds == "search_proposal").sum() == 4 and (kinds == "search_decision").sum() == 4
    # Each run was claimed once (one "running" event) by one of the array's tasks.
    started = events[events["kind"] == "running"]
    assert started["run_id"].is_unique and len(started) == len(runs)
    segments = ledger.segments("slurm-search")
    assert segments["worker"].nunique() == 2
    confirmation = json.loads(events[events["kind"] == "search_confirmation"]["detail"].iloc[0])
    confirm = runs[runs["seed"].isin([10, 11, 12])]
    assert set(confirm["variant"]) == {"base", *confirmation["chosen"]}
    decisions = [json.loads(d) for d in events[events["kind"] == "search_decision"]["detail"]]
    outcomes = sorted(d["outcome"] for d in decisions)
    assert outcomes.count("kept") == 2 and len(outcomes) == 4
    pruned = [d["variant"] for d in decisions if d["outcome"] == "pruned"]
    assert sorted(runs[runs["stop_cause"] == "pruned"]["variant"]) == sorted(pruned * 3)
