"""``campaign.Task``: the task contract with the obvious parts written, so a task writes only
``model``, ``splits`` and ``loss`` (docs/tasks.md).

Examples are dicts. The keys the gates read:

- ``id`` (every example): stable and unique within its split;
- ``group`` (where leakage matters): the unit that must never be split across
  train and val (a patient, a conversation, a source document, a period);
- for classification, ``label`` (an int, index into the task's ``classes``)
  and, when the data names its classes itself, ``class_name`` (checked
  against ``classes[label]``).

The defaults:

- ``collate``: every field stacked in example order: tensors and numpy
  arrays with ``torch.stack``, numbers into a tensor (int64 for ints and
  bools, float32 for floats), anything else (strings, ids, groups) kept as a
  list; ``id`` becomes ``ids``.
- ``outputs(model, batch)``: ``model(batch[self.inputs])`` with floating
  inputs cast to the model's dtype (what ``predict`` calls; use it in
  ``loss`` too).
- ``predict`` / ``score``: for classification (``classes`` set): the argmax
  class against ``classes[label]``, scored by accuracy and macro-F1 (the mean
  over classes of F1, a class absent from both targets and predictions
  skipped); for regression (``kind = "regression"``): the output against
  ``batch[self.target]``, scored by MSE, MAE and R² (when the targets vary).
- ``describe``: every field of the example as a short line, the target named.
- ``control_inputs``: the first ``control_count`` validation examples.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from campaign.loop import task_metrics
from campaign.loop.task import Batch, Example

SHOWN = 200  # characters of a field that describe() shows


class Task:
    """Subclass it; write ``model()``, ``splits()`` and ``loss(model, batch)``."""

    classes: Sequence[str] | None = None  # label id -> class name (classification)
    kind: str = "classification"  # or "regression"
    inputs: str = "x"  # the batch field the model takes
    target: str = "label"  # the batch field predictions are compared with
    control_count: int = 4

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.options: dict[str, Any] = dict(config.get("task", {}))

    # -- what a task writes ----------------------------------------------------------------
    def model(self) -> torch.nn.Module:
        raise NotImplementedError(f"{type(self).__name__}.model() must return the model")

    def splits(self) -> dict[str, Sequence[Example]]:
        raise NotImplementedError(f"{type(self).__name__}.splits() must return the splits")

    def loss(self, model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, int]:
        raise NotImplementedError(
            f"{type(self).__name__}.loss() must return (sum of per-unit losses, units)")

    # -- metrics of its own ----------------------------------------------------------------
    logged_metrics: Sequence[str] = ()  # names it logs: plan checks validation.metric on them

    def log(self, name: str, value: Any, weight: float = 1.0) -> None:
        """Log a value of this update or validation from ``loss``/``predict`` (a batch's
        accuracy, a count): ``train/NAME`` or ``val/NAME`` in the ledger, the weighted mean
        over the update's microbatches (campaign/loop/task_metrics.py, docs/tasks.md)."""
        task_metrics.log_metric(name, value, weight)

    # -- the defaults ----------------------------------------------------------------------
    def collate(self, examples: Sequence[Example]) -> Batch:
        if not examples:
            raise ValueError(f"{type(self).__name__}.collate() was given no examples")
        batch: Batch = {}
        for field in examples[0]:
            values = [example[field] for example in examples]
            batch["ids" if field == "id" else field] = _stacked(values)
        return batch

    def outputs(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        inputs = batch[self.inputs]
        if isinstance(inputs, torch.Tensor) and inputs.is_floating_point():
            inputs = inputs.to(next(model.parameters()).dtype)
        return model(inputs)

    def predict(self, model: torch.nn.Module, batch: Batch) -> list[dict[str, Any]]:
        outputs = self.outputs(model, batch)
        targets = batch[self.target].tolist()
        if self.kind == "regression":
            if outputs.numel() != len(targets):
                raise ValueError(
                    f"{type(self).__name__}: the default predict() scores one output per "
                    f"example, the model gave shape {list(outputs.shape)} for {len(targets)} "
                    "examples: write predict() and score() for several outputs")
            predicted = outputs.reshape(-1).tolist()
            return [{"id": i, "prediction": float(p), "target": float(t)}
                    for i, p, t in zip(batch["ids"], predicted, targets, strict=True)]
        names = self._class_names()
        if outputs.dim() == 0 or outputs.shape[-1] != len(names):
            raise ValueError(
                f"{type(self).__name__}: the default predict() takes one logit per class "
                f"({len(names)} classes), the model gave shape {list(outputs.shape)}: "
                "a single-logit binary model writes its own predict()")
        predicted = outputs.argmax(dim=-1).tolist()
        return [{"id": i, "prediction": names[p], "target": names[t]}
                for i, p, t in zip(batch["ids"], predicted, targets, strict=True)]

    def default_metrics(self) -> tuple[str, ...]:
        """The names the default ``score()`` returns (what ``plan`` checks the spec's metric
        against when the task keeps the default and declares no ``metrics`` of its own)."""
        return ("mse", "mae", "r2") if self.kind == "regression" else ("accuracy", "macro_f1")

    def score(self, records: Sequence[dict[str, Any]]) -> dict[str, float]:
        if not records:
            return {}
        if self.kind == "regression":
            errors = np.array([r["prediction"] - r["target"] for r in records], dtype=float)
            scores = {"mse": float(np.mean(errors**2)), "mae": float(np.mean(np.abs(errors)))}
            targets = np.array([r["target"] for r in records], dtype=float)
            spread = float(np.sum((targets - targets.mean()) ** 2))
            if spread > 0:  # R² (1 - residual / total sum of squares): undefined when flat
                scores["r2"] = 1.0 - float(np.sum(errors**2)) / spread
            return scores
        return _classification_scores(records)

    def describe(self, example: Example) -> dict[str, str]:
        shown = {name: _short(value) for name, value in example.items()}
        if "label" in example and self.classes is not None:
            label = int(example["label"])
            shown["target"] = f"label {label} = class {self._class_names()[label]!r}"
        elif self.target in example:
            shown["target"] = _short(example[self.target])
        return shown

    def control_inputs(self) -> Sequence[Example]:
        validation = self.splits()["val"]
        return [validation[i] for i in range(min(self.control_count, len(validation)))]

    def _class_names(self) -> Sequence[str]:
        if self.classes is None:
            raise NotImplementedError(
                f"{type(self).__name__} has no 'classes' (label id -> name): set it for "
                "classification, or kind = 'regression'")
        return self.classes


def _stacked(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(values)
    if isinstance(first, np.ndarray):
        return torch.from_numpy(np.stack(values))
    if isinstance(first, bool | int | np.integer | np.bool_):
        return torch.tensor([int(value) for value in values], dtype=torch.long)
    if isinstance(first, float | np.floating):
        return torch.tensor(values, dtype=torch.float32)
    return list(values)


def _short(value: Any) -> str:
    if isinstance(value, np.ndarray | torch.Tensor):
        array = np.asarray(value)
        text = np.array2string(array.reshape(-1)[:16], precision=3, separator=" ")
        return f"{text}{' …' if array.size > 16 else ''} (shape {list(array.shape)})"
    text = str(value)
    return text if len(text) <= SHOWN else text[:SHOWN] + "…"


def _classification_scores(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Accuracy and macro-F1 over the classes named as target or prediction. The per-class
    F1s are summed exactly (``math.fsum``), so the score's every bit is the same whatever
    order the classes come in: a set of names iterates in an order that depends on the
    process's hash seed, and a rounded sum in that order made a faithful ``reproduce``
    differ in macro-F1's last bit (docs/tasks.md, `score(records)`)."""
    hits = Counter(r["target"] for r in records if r["prediction"] == r["target"])
    claimed = Counter(r["prediction"] for r in records)
    actual = Counter(r["target"] for r in records)
    f1s = [2 * hits[name] / (claimed[name] + actual[name]) for name in claimed | actual]
    return {"accuracy": sum(hits.values()) / len(records),
            "macro_f1": math.fsum(f1s) / len(f1s)}
