"""The porting guide's example (docs/porting.md): a plain training script
(examples/porting/train_wine.py) and its task (examples/tasks/wine.py), which imports the
script's model and data code unchanged. The script runs as it is; on the same weights and the
same batch the task's loss (a sum over its units) is the script's mean, with the same
gradients; the spec plans and a campaign pilots and trains it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from campaign.ledger import Ledger
from tests.support.launch_helpers import run

ROOT = Path(__file__).resolve().parents[2]


def test_the_script_runs_as_it_is() -> None:
    done = subprocess.run([sys.executable, "examples/porting/train_wine.py", "--steps", "50"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()  # counted from 0, evaluated after steps 0 and 49
    assert lines[0].startswith("step 0: loss ") and lines[-1].startswith("step 49: loss ")


def test_the_task_computes_the_scripts_loss_and_gradients() -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from examples.porting.train_wine import build_model, load_arrays
        from examples.tasks.wine import build
    finally:
        sys.path.remove(str(ROOT))
    task = build({"task": {}})
    train = task.splits()["train"][:16]
    arrays = load_arrays()
    x, y = torch.from_numpy(arrays["train_x"][:16]), torch.from_numpy(arrays["train_y"][:16])
    torch.manual_seed(0)
    theirs = build_model()
    ours = task.model()
    ours.load_state_dict(theirs.state_dict())
    mean = torch.nn.functional.cross_entropy(theirs(x), y)
    mean.backward()
    total, units = task.loss(ours, task.collate(train))
    (total / units).backward()
    assert units == 16 and torch.allclose(total / units, mean, rtol=1e-6, atol=0)
    for mine, script in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.allclose(mine.grad, script.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_the_ported_task_matches_the_scripts_curve_step_for_step(tmp_path: Path) -> None:
    """The spec plans, a campaign pilots and trains it, and its lr-1e-3 run's curve is the
    script's own, step for step: the task gives the script's draw of each step's rows
    (``loop.sampling = "task"``) and validates when the script evaluates (``validation.offset
    = 1``: after its steps 0, 50, 100, counted from 0, and at the end)."""
    updates = 120
    spec = (ROOT / "examples" / "wine.toml").read_text()
    spec = spec.replace("seeds = [0, 1, 2]", "seeds = [0]").replace(
        '"budget.updates" = 300', f'"budget.updates" = {updates}')
    path = tmp_path / "wine.toml"
    path.write_text(spec)
    log = tmp_path / "script.jsonl"
    script = subprocess.run([sys.executable, "examples/porting/train_wine.py", "--steps",
                             str(updates), "--log", str(log)], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert script.returncode == 0, script.stderr[-2000:]
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    for arguments in (["plan", str(path)], ["pilot", "wine-lr"],
                      ["launch", "wine-lr", "--workers", "2", "--artifacts",
                       str(tmp_path / "artifacts")]):
        done = run(url, *arguments)  # from the repository root, as the spec says
        assert done.returncode == 0, (arguments, done.stderr[-3000:])
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    with Ledger.open(url) as ledger:
        accuracy = ledger.comparison("wine-lr", keys=["val/accuracy"])
        runs = ledger.runs("wine-lr")
        (run_id,) = runs.loc[runs["variant"] == "lr-1e-3", "run_id"]
        points = ledger.metrics(runs=[run_id], keys=["train/loss", "val/loss", "val/accuracy"])
        pilot = ledger.pilots("wine-lr")
    assert (accuracy["val/accuracy"] > 0.85).all()  # a real task: it learns
    curve = points.pivot(index="step", columns="key", values="value")
    theirs = pd.Series([s["loss"] for s in steps], index=[s["step"] + 1 for s in steps])
    assert list(curve["train/loss"].index) == list(theirs.index)  # update u is their step u-1
    pd.testing.assert_series_equal(curve["train/loss"], theirs, check_names=False,
                                   check_exact=False, rtol=1e-6, atol=0)
    evaluated = {s["step"] + 1: s for s in steps if "val_loss" in s}
    assert sorted(evaluated) == [1, 51, 101, updates]
    assert list(curve["val/loss"].dropna().index) == sorted(evaluated)
    for update, theirs_at in evaluated.items():
        assert curve.loc[update, "val/loss"] == pytest.approx(theirs_at["val_loss"], rel=1e-6)
        assert curve.loc[update, "val/accuracy"] == pytest.approx(theirs_at["val_accuracy"])
    assert set(pilot["verdict"]) == {"pass"}  # its data gate held the order to its seed
