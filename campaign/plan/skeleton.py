"""``campaign init DIR``: a task skeleton and a spec that ``plan``, ``inspect`` and ``pilot``
pass as they are, for a user to make their own.

The task is a real one (iris species from four measurements, the CSV file that
scikit-learn ships inside its package), written as a user writes a task: a
``campaign.Task`` subclass with ``model``, ``splits`` and ``loss``, every key
the gates read present and explained. Nothing is overwritten.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from campaign.errors import InitError

TASK_FILE = "study_task.py"
SPEC_FILE = "spec.toml"

TASK = '''"""Your task: replace the data and the model, keep the shape.

campaign.Task writes collate (fields stacked, ``id`` -> ``ids``), predict and score
(accuracy and macro-F1 over ``classes``), describe and control_inputs; you write model,
splits and loss. Keys the gates read, on every example:
  id          unique within its split
  group       what must never be split across train and val (patient, document, period)
  label       int, an index into ``classes`` (classification)
  class_name  the data's own name for the class, checked against classes[label] (optional)
Run from this folder: campaign plan spec.toml && campaign inspect {name} && campaign pilot {name}
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_iris
from torch import nn

import campaign


class StudyTask(campaign.Task):
    classes = ("setosa", "versicolor", "virginica")  # label id -> class name

    def model(self) -> nn.Module:
        hidden = int(self.options.get("hidden", 16))  # task.hidden in the spec
        return nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 3))

    def splits(self) -> dict[str, list[dict[str, Any]]]:
        data = load_iris()
        order = np.random.default_rng(int(self.options.get("split_seed", 0))).permutation(150)
        features = data.data.astype(np.float32)

        def example(row: int) -> dict[str, Any]:
            return {{"id": f"flower-{{row}}", "group": f"flower-{{row}}", "x": features[row],
                    "label": int(data.target[row]),
                    "class_name": str(data.target_names[data.target[row]])}}

        return {{"train": [example(r) for r in order[:120]],
                "val": [example(r) for r in order[120:]]}}

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
        # The SUM of per-example losses and the number of examples: the loop divides by the
        # units of the whole effective batch, so accumulation is exact.
        logits = self.outputs(model, batch)
        return nn.functional.cross_entropy(logits, batch["label"], reduction="sum"), len(logits)


def build(config: dict[str, Any]) -> StudyTask:
    return StudyTask(config)
'''

SPEC = '''# {name}: two learning rates against a control, three seeds each (docs/spec.md).
[campaign]
name = "{name}"
question = "Which learning rate classifies best after 100 updates?"
task = "study_task:build"

[hold]
"loop.microbatch" = 8
"loop.accumulation" = 2
"budget.updates" = 100

[config]
"optimizer.name" = "adamw"
"optimizer.lr" = 1e-2
"task.hidden" = 16

[validation]
every = 20
metric = "val/accuracy"
mode = "max"

[stop]
loss_explosion = 4.0

[grid]
seeds = [0, 1, 2]
control = "lr-1e-2"

[[grid.variants]]
name = "lr-1e-2"
set = {{ "optimizer.lr" = 1e-2 }}

[[grid.variants]]
name = "lr-3e-2"
set = {{ "optimizer.lr" = 3e-2 }}
'''


def campaign_name(folder: Path) -> str:
    """The folder's name as a campaign name (letters, digits, ``._-``), else ``my-study``."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", folder.resolve().name).strip("-._")[:100]
    return name or "my-study"


def write_skeleton(folder: Path) -> list[Path]:
    """Write the task and the spec into ``folder`` (made if missing); nothing is overwritten."""
    targets = [folder / TASK_FILE, folder / SPEC_FILE]
    try:
        present = [str(path) for path in targets if path.exists() or path.is_symlink()]
    except OSError as error:  # a name too long, a path through a file
        raise InitError(f"cannot use {folder}: {error.strerror or error}") from None
    if present:
        raise InitError(f"{', '.join(present)} already exist(s): nothing written "
                        "(choose a new folder)")
    name = campaign_name(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for path, text in zip(targets, (TASK, SPEC), strict=True):
            with open(path, "x", encoding="utf-8") as handle:  # created here, never through
                handle.write(text.format(name=name))  # a link planted since the check
    except OSError as error:
        for path in targets:  # none existed before: whatever was written goes
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        raise InitError(f"cannot write into {folder}: {error.strerror or error}") from None
    return targets
