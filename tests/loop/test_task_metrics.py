"""Metrics a task logs itself (campaign/loop/task_metrics.py): under the phase they were logged
in, one weighted mean per update over every rank's microbatches (a sharded rank's zero-weight
filler logs nothing), checked at plan like the task's scores."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from campaign.errors import LoopError
from campaign.ledger import Ledger
from campaign.loop import task_metrics
from campaign.loop.train import execute
from tests.support.launch_helpers import run
from tests.support.loop_helpers import BASE, plan_loop

TASK = "tests.support.tasks.self_logging:build"
KEYS = ["train/batch_accuracy", "train/rows", "train/examples", "val/margin", "val/rows",
        "val/batch_accuracy", "train_eval/batch_accuracy"]


def plan(ledger: Ledger, name: str, hold: dict, size: int = 72) -> str:
    return plan_loop(ledger, name, task=TASK, seeds=[1],
                     hold={"budget.updates": 6, "loop.microbatch": 3, **hold},
                     config={"optimizer.name": "sgd", "optimizer.lr": 0.1, "task.size": size},
                     validation={"every": 3, "metric": "val/accuracy", "train_sample": 8})[0]


def logged(ledger: Ledger, run_id: str) -> pd.DataFrame:
    points = ledger.metrics(runs=[run_id], keys=KEYS)
    return points.pivot(index="step", columns="key", values="value")


@pytest.mark.slow
def test_a_tasks_own_metrics_are_one_mean_per_update_on_any_number_of_ranks(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    ledger = sqlite_ledger
    single = plan(ledger, "one", {"loop.accumulation": 4})
    execute(ledger, single, artifacts=tmp_path, replay_in_subprocess=False)
    expected = logged(ledger, single)
    assert list(expected.columns) == sorted(KEYS)
    # A name under a phase is that phase's alone: validation and the training sample call
    # loss() and predict() too, and neither writes train/examples or val/margin again.
    others = set(ledger.metrics(runs=[single])["key"])
    assert not others & {"val/examples", "train_eval/examples", "train_eval/margin"}
    assert (expected["train/examples"] == 3.0).all()
    assert (expected["train/rows"].dropna() == 3.0).all() and len(expected) == 6
    assert expected["val/margin"].dropna().index.tolist() == [3, 6]
    # 16 validation rows in batches of 12 (microbatch x accumulation) and 4, weighted alike
    assert expected["val/rows"].dropna().tolist() == [8.0, 8.0]
    # The accuracy of the whole effective batch, as the loop's own loss is its mean.
    assert expected["train/batch_accuracy"].between(0, 1).all()
    shown = run(sqlite_url, "curve", single, "--key", "train/batch_accuracy", "--key",
                "val/margin", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    assert '"train/batch_accuracy"' in shown.stdout and '"val/margin"' in shown.stdout

    # Two ranks (replicated), then two sharded ranks on 15 examples: every third update has
    # one microbatch of 3, and rank 1 runs a one-row filler at zero weight, which logs nothing.
    for name, hold, size in (("two", {"loop.replicas": 2, "loop.accumulation": 2}, 72),
                             ("fsdp", {"loop.replicas": 2, "loop.accumulation": 1,
                                       "loop.strategy": "fsdp"}, 15)):
        ranks = plan(ledger, name, hold, size)
        done = run(sqlite_url, "worker", name, "--artifacts", str(tmp_path / name),
                   "--skip-pilot", "--reason", "task metrics test", "--no-replay-check")
        assert done.returncode == 0, done.stderr[-3000:]
        if name == "two":
            # val/rows follows the validation batch (microbatch x accumulation): not compared;
            # the means weighted by rows do not depend on how the rows were cut.
            pd.testing.assert_frame_equal(logged(ledger, ranks).drop(columns="val/rows"),
                                          expected.drop(columns="val/rows"),
                                          check_exact=False, rtol=1e-12, atol=0)
        else:
            mine = logged(ledger, ranks)
            assert (mine["train/rows"] == 3.0).all(), mine  # a filler's 3 rows not counted


def test_the_names_and_values_a_task_may_log() -> None:
    with task_metrics.collecting("train") as collected:
        task_metrics.log_metric("acc", 0.5, weight=2)
        task_metrics.log_metric("acc", 1.0)
        task_metrics.log_metric("val/seen", 3)  # another phase's name: not this phase's
        task_metrics.log_metric("train/seen", torch.tensor(4.0), weight=np.int64(2))
        task_metrics.log_metric("train/seen", 100.0, weight=torch.tensor(0))  # nothing to count
        with task_metrics.paused():
            task_metrics.log_metric("acc", 100.0)
    assert collected.means() == {"train/acc": 2.0 / 3.0, "train/seen": 4.0}
    task_metrics.log_metric("acc", 1.0)  # outside a run's update: nothing kept, no error
    refused = {("loss", 1.0): "train/loss is the loop's own",
               ("a b", 1.0): "a name is 1 to 100",
               ("acc", "high"): "a number, got str"}
    for (name, value), words in refused.items():
        with task_metrics.collecting("train"), pytest.raises(LoopError, match=words):
            task_metrics.log_metric(name, value)
    with task_metrics.collecting("train"), pytest.raises(LoopError, match="finite number >= 0"):
        task_metrics.log_metric("acc", 1.0, weight=-1)
    # On several ranks every rank gathers the same keys: the ones the task declares.
    with task_metrics.collecting("train", ["train/acc"]) as declared:
        task_metrics.log_metric("acc", 1.0)
        with pytest.raises(LoopError, match="add 'rows' to the task's logged_metrics"):
            task_metrics.log_metric("rows", 3)
    assert declared.means() == {"train/acc": 1.0}


def test_plan_checks_a_validation_metric_against_what_the_task_logs(sqlite_url: str,
                                                                    tmp_path: Path) -> None:
    from click.testing import CliRunner

    from campaign.cli import main

    document = copy.deepcopy(BASE)  # the loop tests' spec, as JSON (a spec's frozen form)
    document["campaign"].update(name="own", task=TASK)
    document["config"] = {"optimizer.name": "sgd", "optimizer.lr": 0.1}
    document["validation"]["metric"] = "val/margin"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(document))
    ok = CliRunner().invoke(main, ["--ledger", sqlite_url, "plan", str(spec), "--dry-run"])
    assert ok.exit_code == 0, ok.stderr
    typo = CliRunner().invoke(main, ["--ledger", sqlite_url, "plan", str(spec), "--dry-run",
                                     "--set", "validation.metric=val/margn"])
    assert typo.exit_code == 2
    assert ("--set validation.metric: 'val/margn' is not a metric this task produces (did you "
            "mean 'val/margin'?") in typo.stderr, typo.stderr
