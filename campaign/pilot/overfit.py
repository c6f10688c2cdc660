"""The overfit gate's criterion and its examples.

A handful of examples trained for a few dozen steps must be learned: the loss
falls by a set factor and every prediction is exact (classification), or,
where exact match is unfair (a regression's floats; a next-character model:
two windows starting alike continue differently), a score of the task's own
reaches a threshold in the score's direction (an error falls to it, an
accuracy or R² rises to it).
The spec's ``[pilot]`` table sets it; command-line options override it; the
criterion is recorded with the verdict so a weakened gate shows in the pilot
table and the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from campaign.plan.metric_names import metric_mode

# A regression cannot match floats exactly: its default criterion is R², which 8 examples
# learned for 60 steps reach easily when the task can learn at all.
REGRESSION_DEFAULT = ("r2", 0.99)


@dataclass(frozen=True)
class OverfitCriterion:
    """What the overfit examples must reach: every prediction exact (``metric`` None), or a
    score of the task's own against a threshold in the score's direction."""

    metric: str | None
    threshold: float
    mode: str

    def passes(self, value: float) -> bool:
        return value <= self.threshold if self.mode == "min" else value >= self.threshold

    def words(self) -> str:
        if self.metric is None:
            return "every prediction exact"
        return f"{self.metric} {'<=' if self.mode == 'min' else '>='} {self.threshold:g}"


@dataclass(frozen=True)
class PilotOptions:
    """The overfit gate's criterion: the spec's ``[pilot]`` table, command-line overrides."""

    overfit_examples: int = 8
    overfit_steps: int = 60
    overfit_factor: float = 5.0
    overfit_lr: float = 1e-2
    overfit_metric: str | None = None
    overfit_threshold: float | None = None
    overfit_mode: str | None = None  # min or max; by default from the metric's name

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], **overrides: Any) -> PilotOptions:
        table = {k: v for k, v in (spec.get("pilot") or {}).items() if k in FIELDS}
        return cls(**{**table, **{k: v for k, v in overrides.items() if v is not None}})

    def learned(self, kind: str = "classification") -> OverfitCriterion:
        """The criterion for a task of ``kind``: a given threshold is kept as given (0 stays
        0); a maximised score defaults to 1.0; a regression defaults to R² >= 0.99."""
        metric, threshold = self.overfit_metric, self.overfit_threshold
        if metric is None and kind == "regression":
            metric, default = REGRESSION_DEFAULT
            threshold = default if threshold is None else threshold
        if metric is None:
            return OverfitCriterion(None, 1.0, "max")
        mode = self.overfit_mode or metric_mode(metric)
        if threshold is None:
            if mode == "min":  # no natural floor for an error: the spec must say (plan checks)
                raise ValueError(f"[pilot] overfit_metric {metric!r} is minimised: "
                                 "set overfit_threshold, the value it must fall to")
            threshold = 1.0
        return OverfitCriterion(metric, float(threshold), mode)

    def criterion(self, kind: str = "classification") -> str:
        """The criterion in words, recorded with the verdict."""
        return (f"{self.overfit_examples} examples, {self.overfit_steps} steps at lr "
                f"{self.overfit_lr:g}: loss falls {self.overfit_factor:g}x and "
                f"{self.learned(kind).words()}")


FIELDS = ("overfit_examples", "overfit_steps", "overfit_factor", "overfit_lr", "overfit_metric",
          "overfit_threshold", "overfit_mode")


def varied(examples: Sequence[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """``count`` examples taking each ``label`` (or ``target``) in turn, so that the overfit
    gate sees several targets whenever the split has them; the first ``count`` otherwise."""
    by_value: dict[str, list[dict[str, Any]]] = {}
    for example in examples:
        key = example.get("label", example.get("target"))
        by_value.setdefault(str(key), []).append(example)
    if len(by_value) < 2:
        return list(examples[:count])
    queues = [list(v) for v in by_value.values()]
    chosen: list[dict[str, Any]] = []
    while len(chosen) < count and any(queues):
        for queue in queues:
            if queue and len(chosen) < count:
                chosen.append(queue.pop(0))
    return chosen
