"""Data replicas: exact gradients across ranks (gloo, CPU) and a replicated run end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from campaign.ledger import Ledger
from campaign.loop import replicas as dp
from campaign.loop.train import execute
from campaign.loop.trainer import accumulate
from tests.support.launch_helpers import ROOT, event_counts, losses, run
from tests.support.loop_helpers import plan_quick
from tests.support.replica_gradient import model_and_batches


def test_two_replicas_give_the_single_process_gradient_of_the_effective_batch(
    tmp_path: Path,
) -> None:
    port = dp.free_port()
    command = [sys.executable, "-m", "tests.support.replica_gradient", str(tmp_path)]
    ranks = [
        subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, **dp.environment_for(dp.Replica(r, 2), "127.0.0.1", port)},
        )
        for r in range(2)
    ]
    assert [rank.wait(timeout=120) for rank in ranks] == [0, 0]

    task, model, batches = model_and_batches()
    loss_sum, units = accumulate(task, model, batches)  # one process, all 10 examples
    for r in range(2):
        got = load_file(str(tmp_path / f"rank-{r}.safetensors"))
        assert int(got["units"].item()) == units == 10
        assert abs(float(got["loss_sum"].item()) - loss_sum) < 1e-9
        for name, parameter in model.named_parameters():
            assert got[name].dtype == torch.float64
            torch.testing.assert_close(got[name], parameter.grad, rtol=0, atol=1e-6)
            assert torch.count_nonzero(parameter.grad) > 0


@pytest.mark.slow
def test_a_replicated_run_trains_like_one_process_and_only_rank_0_writes(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    ledger, ledger_url = sqlite_ledger, sqlite_url
    # The same effective batch (8 examples per update, same data order) two ways.
    (single,) = plan_quick(ledger, "single", runs=1, updates=12)
    execute(ledger, single, artifacts=tmp_path / "single", replay_in_subprocess=False)
    (run_id,) = plan_quick(ledger, "replicated", runs=1, updates=12,
                           hold={"loop.replicas": 2, "loop.accumulation": 1})
    config = ledger.run(run_id).config_document
    assert config["budget"]["examples_per_update"] == 8  # the replicas count

    done = run(ledger_url, "worker", "replicated", "--artifacts", str(tmp_path / "artifacts"),
               "--skip-pilot", "--reason", "replica test", "--no-replay-check")
    assert done.returncode == 0, done.stderr[-3000:]
    record = ledger.run(run_id)
    assert (record.status, record.stop_step) == ("completed", 12)
    pd.testing.assert_series_equal(losses(ledger, run_id), losses(ledger, single),
                                   check_exact=False, rtol=0, atol=1e-9)
    # Rank 0 wrote everything once; the follower wrote nothing.
    counts = event_counts(ledger, "replicated")
    assert counts.loc[run_id, "running"] == 1 and counts.loc[run_id, "completed"] == 1
    assert len(ledger.segments("replicated")) == 1
    mine = ledger.metrics(runs=[run_id], all_segments=True)
    theirs = ledger.metrics(runs=[single], all_segments=True)
    assert len(mine) == len(theirs)
    # Every rank's memory is its own: both ranks' update measurements are recorded.
    phases = ledger.phases("replicated")
    updates = phases[phases["phase"].isin(["update", "update_first"])]
    assert {"cpu (rank 0)", "cpu (rank 1)"} <= set(updates["device"]), set(updates["device"])
    by_rank = {rank: updates[updates["device"] == f"cpu (rank {rank})"] for rank in (0, 1)}
    for rows in by_rank.values():  # each rank measured its own process (torch imported)
        assert (rows["rss"] > 50 * 2**20).all() and (rows["rss_peak"] >= rows["rss"]).all()
    assert (by_rank[0]["rss"].tolist(), by_rank[0]["duration_s"].tolist()) != (
        by_rank[1]["rss"].tolist(), by_rank[1]["duration_s"].tolist())  # not rank 0's copied
    kinds = ledger.artifacts("replicated")["kind"].value_counts()
    assert kinds["final"] == 1
    assert kinds["checkpoint"] == len(ledger.artifacts("single").query("kind == 'checkpoint'"))


@pytest.mark.slow
def test_the_pilot_of_a_replicated_class_runs_its_ranks_in_their_group(
    sqlite_ledger: Ledger, tmp_path: Path
) -> None:
    """``loop.replicas = 2``: besides the single-process phases, a ``replicas`` row per rank,
    measured in its own process inside a gloo group; a task whose rank 1 builds another
    model fails it, naming the ranks."""
    from campaign.pilot.phase_gates import run_pilot
    from tests.support.loop_helpers import plan_loop

    hold = {"loop.replicas": 2, "loop.accumulation": 1}
    plan_loop(sqlite_ledger, "pair", hold=hold)
    report = run_pilot(sqlite_ledger, "pair", artifacts=tmp_path / "a")
    assert report.passed, [(r.phase, r.detail) for r in report.records]
    phases = sqlite_ledger.phases("pair")
    rows = phases[phases["phase"] == "replicas"].set_index("device")
    assert list(rows.index) == ["cpu (rank 0)", "cpu (rank 1)"]
    inputs = rows["inputs"].tolist()
    assert [i["rank"] for i in inputs] == [0, 1] and inputs[0]["pid"] != inputs[1]["pid"]
    assert all(i["share"] == 4 and i["examples_per_update"] == 8 for i in inputs)
    assert (rows["rss_peak"] > 50 * 2**20).all() and (rows["duration_s"] > 0).all()
    assert "the same parameters on every rank" in rows["detail"].iloc[0]
    for pid in (i["pid"] for i in inputs[1:]):  # the follower is gone
        assert not Path(f"/proc/{pid}").exists()

    plan_loop(sqlite_ledger, "drift", hold=hold, task="tests.support.tasks.faulty:build",
              config={"task.fault": "rank_drift"})
    drifted = run_pilot(sqlite_ledger, "drift", artifacts=tmp_path / "b")
    assert not drifted.passed
    failed = [r for r in drifted.records if r.verdict == "fail"]
    assert [r.phase for r in failed] == ["replicas", "replicas"]
    assert "the parameters differ across ranks (rank 0 against 1)" in failed[0].detail
