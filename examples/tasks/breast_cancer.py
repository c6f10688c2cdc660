"""Tumour diagnosis from 30 measurements of a breast mass (the Wisconsin set that scikit-learn
ships inside its package: no download), as a user writes a task: ``model``, ``splits`` and
``loss``; ``campaign.Task`` gives collate, predict, score (accuracy, macro-F1), describe and
the control inputs.

The leakage unit is the patient: every row is one patient's biopsy, so the split is by
``group`` = patient, fixed by ``task.split_seed`` whatever the run's seed. The features are
standardised with the training split's statistics only (the validation split must not leak
into them).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_breast_cancer
from torch import nn

import campaign

# Imported once by the task host, before it forks this task's children (a plan call, each
# pilot check, each run and replay): scikit-learn takes about 1.5 s to import in each of them
# otherwise. Read from this file without importing it; name only libraries, which import
# without starting threads or touching the GPU.
PRELOAD = ("sklearn.datasets",)


class BreastCancer(campaign.Task):
    classes = ("malignant", "benign")  # label id -> class name, as the data set names them

    def model(self) -> nn.Module:
        hidden = int(self.options.get("hidden", 32))
        return nn.Sequential(nn.Linear(30, hidden), nn.ReLU(), nn.Linear(hidden, 2))

    def splits(self) -> dict[str, list[dict[str, Any]]]:
        data = load_breast_cancer()
        patients = np.random.default_rng(int(self.options.get("split_seed", 0))).permutation(
            len(data.target))
        cut = int(len(patients) * (1 - float(self.options.get("val_fraction", 0.2))))
        train = data.data[patients[:cut]]
        mean, std = train.mean(axis=0), train.std(axis=0) + 1e-8  # training split only
        features = ((data.data - mean) / std).astype(np.float32)

        def example(row: int) -> dict[str, Any]:
            return {"id": f"biopsy-{row}", "group": f"patient-{row}", "x": features[row],
                    "label": int(data.target[row]),
                    "class_name": str(data.target_names[data.target[row]])}

        return {"train": [example(r) for r in patients[:cut]],
                "val": [example(r) for r in patients[cut:]]}

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
        logits = self.outputs(model, batch)
        return nn.functional.cross_entropy(logits, batch["label"], reduction="sum"), len(logits)


def build(config: dict[str, Any]) -> BreastCancer:
    return BreastCancer(config)
