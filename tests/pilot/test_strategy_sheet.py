"""`campaign size` by strategy, checked against measurement: a sharded class piloted at W = 2
and W = 4 on CPU; each rank's tensor peak (PyTorch's own FSDPMemTracker over an update) against
the sheet's projected bytes per device, and each rank's share of the state against its
projection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from campaign.ledger import Ledger
from campaign.pilot.phase_gates import run_pilot
from tests.support.launch_helpers import run
from tests.support.loop_helpers import plan_loop

STATE = ("weights_bytes", "gradient_bytes", "optimizer_bytes")


@pytest.mark.slow
def test_the_projected_per_rank_memory_of_a_sharded_class_is_what_its_ranks_hold(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    for world in (2, 4):
        name = f"fsdp-{world}"
        plan_loop(sqlite_ledger, name, task="campaign.tasks.arithmetic:build",
                  config={"task.train_size": 200, "task.val_size": 16, "task.width": 64,
                          "task.layers": 2},
                  hold={"loop.microbatch": 4, "loop.accumulation": 1, "loop.replicas": world,
                        "loop.strategy": "fsdp", "budget.updates": 10},
                  validation={"every": 5, "metric": "val/accuracy", "sample": 8})
        report = run_pilot(sqlite_ledger, name, artifacts=tmp_path / name)
        assert report.passed, [(r.phase, r.detail) for r in report.records if r.verdict == "fail"]
        done = run(sqlite_url, "size", name, "--format", "json")
        assert done.returncode == 0, done.stderr
        sheet = json.loads(done.stdout)
        (line,) = sheet["classes"]
        assert line["strategy"] == "fsdp" and line["rental_fsdp"] == "1 x 16 GiB"
        rows = {(r["strategy"], r["ranks"]): r for r in sheet["strategies"]}
        assert set(rows) == {(s, w) for s in ("replicate", "fsdp") for w in (1, 2, 4, 8)}
        projected, whole = rows[("fsdp", world)], rows[("replicate", world)]
        assert projected["examples_per_update"] == whole["examples_per_update"] == 4 * world
        phases = sqlite_ledger.phases(name)
        ranks = phases[phases["phase"] == "replicas"]["inputs"].tolist()
        assert [r["rank"] for r in ranks] == list(range(world))
        for measured in ranks:
            held, peak = measured["state_bytes"], measured["tensor_peak"]["Total"]
            assert peak == pytest.approx(projected["per_device_bytes"], rel=0.15), (world, peak)
            share = sum(held.values()) / sum(whole[k] for k in STATE)
            assert share == pytest.approx(
                sum(projected[k] for k in STATE) / sum(whole[k] for k in STATE), abs=0.05)
            assert share == pytest.approx(1 / world, rel=0.1)
