"""Sharded runs (``loop.strategy = "fsdp"``, PyTorch's FSDP2 on gloo): the series of one
process, checkpoints of shards that resume exactly on the same and on another number of ranks,
and the full model as the final artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from campaign.ledger import Ledger
from campaign.loop import checkpoint as ckpt
from campaign.loop import replicas as dp
from campaign.loop import shard_files
from campaign.loop.train import execute
from tests.support.launch_helpers import run
from tests.support.loop_helpers import plan_loop

ARITHMETIC = "campaign.tasks.arithmetic:build"
SMALL = {"task.train_size": 300, "task.val_size": 16, "task.width": 32, "task.layers": 2,
         "optimizer.name": "adamw", "optimizer.lr": 3e-3, "loop.clip_grad_norm": 1.0}


def series(ledger: Ledger, run_id: str) -> pd.DataFrame:
    points = ledger.metrics(runs=[run_id], keys=["train/loss", "train/grad_norm"])
    return points.pivot(index="step", columns="key", values="value")


def plan_arithmetic(ledger: Ledger, name: str, updates: int, hold: dict[str, Any]) -> str:
    return plan_loop(ledger, name, task=ARITHMETIC, config=SMALL, seeds=[3],
                     hold={"loop.microbatch": 3, "budget.updates": updates, **hold},
                     validation={"every": 10, "metric": "val/accuracy", "sample": 8})[0]


def worker(url: str, name: str, artifacts: Path, *extra: str) -> Any:
    done = run(url, "worker", name, "--artifacts", str(artifacts), "--skip-pilot",
               "--reason", "sharding test", "--no-replay-check", *extra)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_a_sharded_run_takes_one_process_updates_and_writes_the_full_model(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    ledger = sqlite_ledger
    single = plan_arithmetic(ledger, "single", 50, {"loop.accumulation": 4})
    execute(ledger, single, artifacts=tmp_path / "single", replay_in_subprocess=False)
    sharded = plan_arithmetic(ledger, "sharded", 50, {"loop.accumulation": 2,
                                                     "loop.replicas": 2,
                                                     "loop.strategy": "fsdp"})
    worker(sqlite_url, "sharded", tmp_path / "a")
    record = ledger.run(sharded)
    assert (record.status, record.stop_step) == ("completed", 50), record
    ours, theirs = series(ledger, sharded), series(ledger, single)
    assert len(ours) == 50
    pd.testing.assert_frame_equal(ours, theirs, check_exact=False, rtol=1e-6, atol=0)
    events = ledger.events("sharded")
    sharding = events[events["kind"] == "sharding"]["detail"].tolist()
    assert sharding == ["FSDP2 over 2 ranks, 2 units: the task's shard_units()"]
    # The final artifact is the full model: exactly the shards of the last checkpoint, joined.
    artifacts = ledger.artifacts("sharded")
    final = artifacts.query("kind == 'final'")["path"].iloc[0]
    last = artifacts.query("kind == 'checkpoint'").sort_values("step").iloc[-1]
    assert Path(last["path"]).with_name(Path(last["path"]).stem + ".rank-1.safetensors").is_file()
    tensors, state = shard_files.load(Path(last["path"]), last["sha256"], dp.Replica(0, 1))
    saved = ckpt.join_state(state["model"], tensors)
    reference = load_file(ledger.artifacts("single").query("kind == 'final'")["path"].iloc[0])
    with safe_open(final, "pt") as mine:
        assert sorted(mine.keys()) == sorted(saved) == sorted(reference)
        for key in saved:
            assert torch.equal(mine.get_tensor(key), saved[key]), key
            assert mine.get_tensor(key).shape == reference[key].shape
