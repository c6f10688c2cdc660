"""Loader workers (campaign/loop/loader.py): with random per-example augmentation, 2 workers give
the 0-worker loss series exactly, and a SIGTERM + resume in a new process continues it exactly;
a worker's error names the example and fails the run; every update records its data wait."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from campaign.ledger import Ledger
from tests.support.launch_helpers import invoke, run_interrupt_resume
from tests.support.loop_helpers import plan_loop

TASK = "tests.support.tasks.augmented:build"


def _plan(ledger: Ledger, name: str, workers: int, **config: object) -> str:
    return plan_loop(ledger, name, task=TASK,
                     hold={"loop.loader_workers": workers, "loop.prefetch": 2},
                     config={"optimizer.lr": 0.05, **{f"task.{k}": v for k, v in config.items()}},
                     validation={"every": 6})[0]


def _series(ledger: Ledger, campaign: str, key: str = "train/loss") -> list[float]:
    frame = ledger.metrics(campaign, keys=[key]).sort_values("step")
    return frame["value"].tolist()


def test_two_workers_and_a_resume_give_the_zero_worker_series_exactly(
    sqlite_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "signalled"
    with Ledger.open(sqlite_url, create=True) as ledger:
        plain = _plan(ledger, "zero", 0)
        workers = _plan(ledger, "two", 2)
        cut = _plan(ledger, "cut", 2, fault="sigterm", at=11, marker=str(marker))
    artifacts = str(tmp_path / "a")
    run_interrupt_resume(sqlite_url, artifacts, (plain, workers), cut, "loader test")
    assert marker.exists()
    with Ledger.open(sqlite_url) as ledger:
        zero, two, again = (_series(ledger, name) for name in ("zero", "two", "cut"))
        stop_step = ledger.segments("cut")["start_step"].tolist()
        waits = _series(ledger, "two", "train/data_wait_s")
        val = [_series(ledger, n, "val/loss") for n in ("zero", "two", "cut")]
    assert len(zero) == 12 and zero == two == again  # bit for bit, augmentation included
    assert val[0] == val[1] == val[2]
    assert stop_step[0] == 0 and 1 < stop_step[1] < 12  # it really was cut and resumed
    assert len(waits) == 12 and all(w >= 0 for w in waits) and max(waits) > 0  # measured
    assert len(set(zero)) > 6  # the series moves: the comparison is not of constants


def test_a_worker_error_names_the_example_and_fails_the_run(
    sqlite_url: str, tmp_path: Path
) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        broken = _plan(ledger, "broken", 2, train_size=-5)  # __len__ < 0: refused by torch
        bad_index = plan_loop(ledger, "badindex",
                              task="tests.support.tasks.augmented:build_shortened",
                              hold={"loop.loader_workers": 2})[0]
        dying = plan_loop(ledger, "dying", task="tests.support.tasks.augmented:build_dying",
                          hold={"loop.loader_workers": 2})[0]
    for run_id in (broken, bad_index, dying):  # each run in a fresh child of the task host
        done = invoke(sqlite_url, "run", run_id, "--artifacts", str(tmp_path / "a"),
                      "--skip-pilot", "--reason", "loader test")
        assert done.returncode == 1, done.stderr[-2000:]
    with Ledger.open(sqlite_url) as ledger:
        run, died = ledger.run(bad_index), ledger.run(dying)
    assert (died.status, died.stop_cause) == ("failed", "exception")  # not a hang
    assert "exited unexpectedly" in (died.stop_detail or ""), died.stop_detail
    assert (run.status, run.stop_cause) == ("failed", "exception")
    assert "reading training example at index" in (run.stop_detail or "")


def test_sampling_with_replacement_resumes_exactly_and_the_order_command_shows_it(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Random draws each update (seeded by run and update): a SIGTERM + resume with workers
    continues the uninterrupted series; `campaign order` shows the ids each update trained on
    (checked against the loop's own batches)."""

    import torch

    from campaign.loop.task import build_task
    from campaign.loop.trainer import Trainer

    marker = tmp_path / "signalled"
    with Ledger.open(sqlite_url, create=True) as ledger:
        plain = plan_loop(ledger, "drawn", task=TASK, hold={"loop.sampling": "with_replacement"},
                          config={"optimizer.lr": 0.05}, validation={"every": 6})[0]
        cut = plan_loop(ledger, "drawn-cut", task=TASK,
                        hold={"loop.sampling": "with_replacement", "loop.loader_workers": 2},
                        config={"optimizer.lr": 0.05, "task.fault": "sigterm", "task.at": 9,
                                "task.marker": str(marker)},
                        validation={"every": 6})[0]
        config = ledger.run(plain).config_document
    artifacts = str(tmp_path / "a")
    run_interrupt_resume(sqlite_url, artifacts, (plain,), cut, "loader test")
    with Ledger.open(sqlite_url) as ledger:
        assert _series(ledger, "drawn") == _series(ledger, "drawn-cut")
    shown = invoke(sqlite_url, "order", plain, "--updates", "2:4", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    assert [r["update"] for r in rows] == [2, 3, 4]
    assert {(r["epoch"], r["positions"]) for r in rows} == {(None, "drawn at random")}
    budget = config["budget"]  # what the run does: draws, not epochs
    assert budget["epochs"] is None and budget["updates_per_epoch"] is None
    assert budget["examples_seen"] == budget["updates"] * 8
    assert budget["draws_per_example"] == budget["examples_seen"] / 320
    trainer = Trainer(build_task(TASK, config), config, torch.device("cpu"))
    used = []
    for _ in range(4):
        _, batches, _ = trainer.next_update()
        used.append([list(b["ids"]) for b in batches])
    trainer.close()
    assert [r["microbatches"] for r in rows] == used[1:]
    ids = [i for r in rows for m in r["microbatches"] for i in m]
    assert len(ids) == 3 * 8  # 4 x 2 an update; drawn with replacement from 320
    bad = invoke(sqlite_url, "order", plain, "--updates", "9:x")
    assert bad.returncode == 2 and "expected FIRST:LAST" in bad.stderr


def test_validation_on_a_fixed_sample_and_an_estimate_of_the_training_loss(
    sqlite_url: str, tmp_path: Path
) -> None:
    """validation.sample: the same 10 of 40 validation examples every time (the predictions
    say which); validation.train_sample: train_eval/loss and scores at every validation."""
    import pandas as pd

    from campaign.gates.launch_gate import open_gate
    from campaign.loop.train import execute

    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id = plan_loop(ledger, "sampled", task=TASK, config={"optimizer.lr": 0.05},
                           validation={"every": 6, "sample": 10, "train_sample": 16})[0]
        open_gate(ledger, "sampled", skip_reason="loader test")
        outcome = execute(ledger, run_id, artifacts=tmp_path / "a", replay_in_subprocess=False)
        assert outcome.status == "completed"
        points = ledger.metrics("sampled")
        files = ledger.artifacts("sampled")
        from campaign.report.balance import balance_sheet

        run_line = balance_sheet(ledger, "sampled").runs.iloc[0]
    waits = points[points["key"] == "train/data_wait_s"]["value"]
    assert run_line["data_wait_s"] == pytest.approx(waits.sum())  # the input-bound share
    assert 0 < run_line["input_bound"] < 1
    estimate = points[points["key"] == "train_eval/loss"]
    assert estimate["step"].tolist() == [6, 12] and estimate["value"].notna().all()
    assert set(points["key"]) >= {"train_eval/accuracy", "train_eval/macro_f1", "val/loss"}
    predictions = [pd.read_parquet(p) for p in files[files["kind"] == "predictions"]["path"]]
    assert [len(p) for p in predictions] == [10, 10]
    assert predictions[0]["id"].tolist() == predictions[1]["id"].tolist()  # the same sample


def test_a_task_that_says_its_reads_draw_nothing_is_held_to_its_word() -> None:
    """Built-in tasks declare ``random_examples = False`` and are read unseeded (seeding costs
    25x the digits collate); the data gate reads and collates their first examples under two
    seeds, which must agree, and refuses a task whose declaration is false."""
    import random

    import torch

    from campaign.loop.loader import draws_randomness
    from campaign.loop.task import build_task
    from campaign.pilot.data_gate import check_data
    from campaign.pilot.randomness import declared_randomness

    config = {"task": {}, "loop": {}, "seed": 0}
    digits = build_task("campaign.tasks.digits:build", config)
    augmented = build_task(TASK, config)
    lying = build_task("tests.support.tasks.augmented:build_undeclared", config)
    assert not draws_randomness(digits) and draws_randomness(augmented)
    found = {name: next(f for f in check_data(task, config)
                        if f.check == "random_examples_declared")
             for name, task in (("digits", digits), ("augmented", augmented),
                                ("lying", lying))}
    before = torch.get_rng_state(), random.getstate()
    assert not declared_randomness(lying).ok  # the check itself leaves the generators be
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    assert found["digits"].ok and "32 training examples read and collated under two seeds: " \
        "identical" in found["digits"].detail
    assert found["augmented"].ok and "seeded" in found["augmented"].detail
    assert not found["lying"].ok and "differ in 'x'" in found["lying"].detail, found["lying"]
    assert "remove random_examples = False" in found["lying"].advice
