"""A task's own order of examples (``loop.sampling = "task"``, campaign/loop/task_order.py):
trained on as given, resumed exactly after a SIGTERM with loader workers, shown by `campaign
order`; validation offset by one update; a faulty order is one clear line, in the pilot's
data gate or in the run, never a silent other order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from campaign.errors import LoopError
from campaign.ledger import Ledger
from campaign.loop.task import build_task
from campaign.loop.task_order import TaskOrder, order_problem
from campaign.pilot.data_gate import check_data
from campaign.pilot.randomness import own_order
from tests.support.launch_helpers import invoke, run_interrupt_resume
from tests.support.loop_helpers import plan_loop

TASK = "tests.support.tasks.ordered:build"
LOOP = {"loop.sampling": "task", "loop.microbatch": 4, "loop.accumulation": 2}


def _series(ledger: Ledger, campaign: str, key: str) -> dict[int, float]:
    frame = ledger.metrics(campaign, keys=[key]).sort_values("step")
    return dict(zip(frame["step"], frame["value"], strict=True))


def test_a_tasks_order_trains_resumes_exactly_and_is_shown(sqlite_url: str,
                                                           tmp_path: Path) -> None:
    marker = tmp_path / "signalled"
    with Ledger.open(sqlite_url, create=True) as ledger:
        plain = plan_loop(ledger, "own", task=TASK, hold=LOOP,
                          validation={"every": 4, "offset": 1})[0]
        cut = plan_loop(ledger, "own-cut", task=TASK, hold={**LOOP, "loop.loader_workers": 2},
                        config={"task.fault": "sigterm", "task.at": 11,
                                "task.marker": str(marker)},
                        validation={"every": 4, "offset": 1})[0]
        config = ledger.run(plain).config_document
    run_interrupt_resume(sqlite_url, str(tmp_path / "a"), (plain,), cut, "task order test")
    with Ledger.open(sqlite_url) as ledger:
        assert _series(ledger, "own", "train/loss") == _series(ledger, "own-cut", "train/loss")
        validated = _series(ledger, "own", "val/loss")
        assert sorted(validated) == [1, 5, 9, 12]  # after 1, 5, 9 (offset 1) and at the end
        assert validated == _series(ledger, "own-cut", "val/loss")
    shown = invoke(sqlite_url, "order", plain, "--updates", "2:3", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    assert {(r["epoch"], r["positions"]) for r in rows} == {(None, "drawn by the task")}
    task = build_task(TASK, config)
    train = task.splits()["train"]
    given = iter(task.training_order(0, 8))
    expected = [[str(train[i]["id"]) for i in next(given)] for _ in range(3)][1:]
    assert [[i for m in r["microbatches"] for i in m] for r in rows] == expected
    assert config["budget"]["epochs"] is None


def _order(name: str) -> TaskOrder:
    task = build_task(TASK, {"task": {"limit": 40, "order": name}, "loop": {}, "seed": 0})
    return TaskOrder(task, len(task.splits()["train"]), 0, 8)


@pytest.mark.parametrize(("name", "words"), [
    ("short", "training_order() ended after 3 updates; the run needs update 4"),
    ("outside", "training_order() gave update 2 index 32, outside the training split's 32"),
    ("big", "training_order() gave update 1 9 examples; an update takes 1 to 8"),
])
def test_a_faulty_order_is_one_line_naming_the_update(name: str, words: str) -> None:
    order = _order(name)
    with pytest.raises(LoopError) as raised:
        for _ in range(5):
            order.next_update()
    assert words in str(raised.value)


def test_an_order_from_the_global_generators_is_refused_by_the_data_gate() -> None:
    config = {"task": {"limit": 40, "order": "global"}, "loop": {"sampling": "task",
              "microbatch": 4, "accumulation": 2}, "seed": 0}
    task = build_task(TASK, config)
    before = torch.get_rng_state()
    (found,) = own_order(task, config, task.splits()["train"])
    assert torch.equal(torch.get_rng_state(), before)  # the check draws nothing of ours
    assert not found.ok and "update 1 other examples when drawn again" in found.detail
    good = build_task(TASK, {**config, "task": {"limit": 40}})
    assert order_problem(good, 32, 0, 8) is None
    (passed,) = [f for f in check_data(good, {**config, "task": {"limit": 40}})
                 if f.check == "training_order"]
    assert passed.ok


def test_a_resume_on_another_order_is_refused() -> None:
    order = _order("walk")
    for _ in range(4):
        order.next_update()
    state = order.state()
    other = _order("walk")
    other.restore(state)  # the same order: the digest agrees
    assert other.next_update() == order.next_update()
    changed = TaskOrder(build_task(TASK, {"task": {"limit": 40}, "loop": {}, "seed": 0}), 32,
                        1, 8)  # another seed: another walk
    with pytest.raises(LoopError, match="another order than this run trained on"):
        changed.restore(state)


def test_an_order_as_long_as_the_budget_runs_with_loader_workers_drawing_ahead(
        sqlite_url: str, tmp_path: Path) -> None:
    """The loader's workers draw past the order's last update; the run never needs it."""
    from campaign.loop.train import execute

    with Ledger.open(sqlite_url, create=True) as ledger:
        (run_id,) = plan_loop(ledger, "exact", task=TASK,
                              hold={**LOOP, "loop.loader_workers": 1, "budget.updates": 3},
                              config={"task.order": "short"}, validation={"every": 3})
        outcome = execute(ledger, run_id, artifacts=tmp_path / "a", replay_in_subprocess=False)
        assert outcome.status == "completed", outcome
