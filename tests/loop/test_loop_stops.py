"""Every stop cause, produced by a real run, lands in the ledger with the right status."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from campaign.ledger import Ledger, RunRecord
from campaign.loop.outcome import RunOutcome
from campaign.loop.train import execute
from tests.support.loop_helpers import plan_loop

FAULTY = "tests.support.tasks.faulty:build"


@pytest.fixture
def ledger(sqlite_url: str) -> Iterator[Ledger]:
    with Ledger.open(sqlite_url, create=True) as opened:
        yield opened


def _run(ledger: Ledger, tmp_path: Path, **plan: Any) -> tuple[RunOutcome, RunRecord]:
    run_id = plan_loop(ledger, **plan)[0]
    outcome = execute(ledger, run_id, artifacts=tmp_path / "artifacts", replay_in_subprocess=False)
    return outcome, ledger.run(run_id)


def _stop(run: RunRecord) -> tuple[Any, ...]:
    return run.status, run.stop_cause, run.stop_step, run.stop_phase


def test_budget_reached(ledger: Ledger, tmp_path: Path) -> None:
    _, run = _run(ledger, tmp_path)
    assert _stop(run) == ("completed", "budget_reached", 12, "update")
    curve = ledger.metrics("loop", keys=["train/loss"])
    assert list(curve["step"]) == list(range(1, 13))
    assert list(ledger.metrics("loop", keys=["val/accuracy"])["step"]) == [4, 8, 12]
    kinds = set(ledger.artifacts("loop")["kind"])
    assert {"checkpoint", "predictions", "final"} <= kinds
    assert set(ledger.phases("loop")["phase"]) >= {
        "data",
        "backward",
        "update_first",
        "validation",
        "export",
    }


def test_non_finite_loss_keeps_the_curve(ledger: Ledger, tmp_path: Path) -> None:
    _, run = _run(ledger, tmp_path, task=FAULTY, config={"task.fault": "nan", "task.at": 5})
    assert _stop(run) == ("diverged", "non_finite_loss", 3, "forward")
    curve = ledger.metrics("loop", keys=["train/loss"])
    assert list(curve["step"]) == [1, 2, 3] and math.isnan(curve["value"].iloc[-1])


def test_non_finite_gradient(ledger: Ledger, tmp_path: Path) -> None:
    _, run = _run(ledger, tmp_path, task=FAULTY, config={"task.fault": "inf_grad", "task.at": 3})
    assert _stop(run) == ("diverged", "non_finite_grad", 2, "backward")


def test_loss_explosion_from_a_huge_learning_rate(ledger: Ledger, tmp_path: Path) -> None:
    _, run = _run(ledger, tmp_path, config={"optimizer.name": "sgd", "optimizer.lr": 50.0})
    assert run.status == "diverged"
    assert run.stop_cause in ("loss_explosion", "non_finite_loss")
    assert run.stop_step is not None and run.stop_step < 12


def test_early_stop_by_patience(ledger: Ledger, tmp_path: Path) -> None:
    _, run = _run(
        ledger,
        tmp_path,
        config={"optimizer.lr": 1e-9},
        stop={"patience": 2},
        validation={"every": 1},
    )
    assert _stop(run) == ("stopped", "early_stop", 3, "validation")


def test_wall_time(ledger: Ledger, tmp_path: Path) -> None:
    _, run = _run(
        ledger,
        tmp_path,
        task=FAULTY,
        config={"task.sleep": 0.1},
        stop={"wall_time": "1s"},
        hold={"budget.updates": 1000},
    )
    assert run.status == "stopped" and run.stop_cause == "wall_time"
    assert 2 <= run.stop_step < 1000


def test_exception_with_traceback_artifact(ledger: Ledger, tmp_path: Path) -> None:
    _, run = _run(ledger, tmp_path, task=FAULTY, config={"task.fault": "raise", "task.at": 4})
    assert (run.status, run.stop_cause, run.stop_step) == ("failed", "exception", 1)
    assert "RuntimeError: injected failure" in run.stop_detail
    tracebacks = ledger.artifacts("loop")
    path = Path(tracebacks[tracebacks["kind"] == "traceback"]["path"].iloc[0])
    assert "injected failure in the task's loss" in path.read_text()


def test_out_of_memory_records_phase_and_inputs(ledger: Ledger, tmp_path: Path) -> None:
    _, run = _run(ledger, tmp_path, task=FAULTY, config={"task.fault": "oom", "task.at": 2})
    assert (run.status, run.stop_cause, run.stop_phase) == ("oom", "out_of_memory", "forward")
    assert '"microbatch":4' in run.stop_detail and "shapes" in run.stop_detail


def test_an_oom_in_validation_names_its_batch_and_the_relaunch_that_fits(
        ledger: Ledger, tmp_path: Path) -> None:
    """The detail names the validation batch (not the last update's shapes) and the recipe;
    the recipe is a relaunch that is accepted and completes."""
    from tests.support.launch_helpers import in_process

    _, run = _run(ledger, tmp_path, task=FAULTY, config={"task.fault": "val_oom", "task.at": 2})
    assert (run.status, run.stop_cause, run.stop_phase) == ("oom", "out_of_memory", "validation")
    assert '"validation_batch":8' in run.stop_detail and "shapes" not in run.stop_detail
    assert "relaunch with --set validation.microbatch=4" in run.stop_detail
    done = in_process("--ledger", ledger.url, "relaunch", run.id, "--set",
                      "validation.microbatch=2", "--reason", "OOM in validation")
    assert done.returncode == 0, done.stderr
    again = ledger.runs("loop")
    new_id = again[again["relaunch_of"] == run.id]["run_id"].iloc[0]
    assert ledger.run(new_id).config_document["validation"]["microbatch"] == 2
    execute(ledger, new_id, artifacts=tmp_path / "artifacts", replay_in_subprocess=False)
    assert ledger.run(new_id).status == "completed"
    for bad in ("validation.microbatch=0", "validation.microbatch=9", "validation.every=3"):
        refused = in_process("--ledger", ledger.url, "relaunch", run.id, "--set", bad,
                             "--reason", "x")
        assert refused.returncode == 2 and bad.split("=")[0] in refused.stderr
    twice = in_process("--ledger", ledger.url, "relaunch", run.id, "--set",
                       "validation.microbatch=2", "--set", "validation.microbatch=4",
                       "--reason", "x")
    assert twice.returncode == 2 and "given more than once" in twice.stderr


def test_a_task_that_breaks_the_contract_fails_the_run_cleanly(
    ledger: Ledger, tmp_path: Path
) -> None:
    # has only splits()
    run_id = plan_loop(ledger, task="tests.support.tasks.tiny:build_partial")[0]
    with pytest.raises(Exception, match="missing model, collate, loss"):
        execute(ledger, run_id, artifacts=tmp_path, replay_in_subprocess=False)
    run = ledger.run(run_id)
    assert (run.status, run.stop_cause, run.stop_phase) == ("failed", "exception", "setup")
