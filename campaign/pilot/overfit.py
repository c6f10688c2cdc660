"""The overfit gate's criterion and its examples.

A handful of examples trained for a few dozen steps must be learned: the loss
falls by a set factor and every prediction is exact (classification), or,
where exact match is unfair (a next-character model: two windows starting
alike continue differently), a score of the task's own reaches a threshold.
The spec's ``[pilot]`` table sets it; command-line options override it; the
criterion is recorded with the verdict so a weakened gate shows in the pilot
table and the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PilotOptions:
    """The overfit gate's criterion: the spec's ``[pilot]`` table, command-line overrides."""

    overfit_examples: int = 8
    overfit_steps: int = 60
    overfit_factor: float = 5.0
    overfit_lr: float = 1e-2
    overfit_metric: str | None = None
    overfit_threshold: float | None = None

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], **overrides: Any) -> PilotOptions:
        table = {k: v for k, v in (spec.get("pilot") or {}).items() if k in FIELDS}
        return cls(**{**table, **{k: v for k, v in overrides.items() if v is not None}})

    def criterion(self) -> str:
        """The criterion in words, recorded with the verdict."""
        learned = (f"{self.overfit_metric} >= {self.overfit_threshold or 1.0:g}"
                   if self.overfit_metric else "every prediction exact")  # fmt: skip
        return (f"{self.overfit_examples} examples, {self.overfit_steps} steps at lr "
                f"{self.overfit_lr:g}: loss falls {self.overfit_factor:g}x and {learned}")


FIELDS = ("overfit_examples", "overfit_steps", "overfit_factor", "overfit_lr", "overfit_metric",
          "overfit_threshold")  # fmt: skip





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
