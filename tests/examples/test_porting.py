"""The porting guide's example (docs/porting.md): a plain training script
(examples/porting/train_wine.py) and its task (examples/tasks/wine.py), which imports the
script's model and data code unchanged. The script runs as it is; on the same weights and the
same batch the task's loss (a sum over its units) is the script's mean, with the same
gradients; the spec plans and a campaign pilots and trains it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from campaign.ledger import Ledger
from tests.support.launch_helpers import run

ROOT = Path(__file__).resolve().parents[2]


def test_the_script_runs_as_it_is() -> None:
    done = subprocess.run([sys.executable, "examples/porting/train_wine.py", "--steps", "50"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("step 50: loss ")


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
def test_the_ported_task_plans_pilots_and_trains(tmp_path: Path) -> None:
    spec = (ROOT / "examples" / "wine.toml").read_text()
    spec = spec.replace("seeds = [0, 1, 2]", "seeds = [0]").replace(
        '"budget.updates" = 300', '"budget.updates" = 100')
    path = tmp_path / "wine.toml"
    path.write_text(spec)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    for arguments in (["plan", str(path)], ["pilot", "wine-lr"],
                      ["launch", "wine-lr", "--workers", "2", "--artifacts",
                       str(tmp_path / "artifacts")]):
        done = run(url, *arguments)  # from the repository root, as the spec says
        assert done.returncode == 0, (arguments, done.stderr[-3000:])
    with Ledger.open(url) as ledger:
        accuracy = ledger.comparison("wine-lr", keys=["val/accuracy"])
    assert (accuracy["val/accuracy"] > 0.85).all()  # a real task: it learns
