"""The metrics a spec names must be metrics the task produces.

Validation logs ``val/loss``, ``val/<name>`` for each name ``score()`` returns and the
``val/`` metrics the task logs itself (declared in ``logged_metrics``, or seen by the pilot). A
``validation.metric`` (which the stop rules' patience also reads) or a ``[pilot]
overfit_metric`` that the task never produces would let every run train to its end and
leave a report with no value at all; so it is refused: at ``plan`` when the task declares
its metrics (``metrics = ("accuracy",)``), in the pilot's validation phase otherwise.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any


def produced(scores: Iterable[str]) -> list[str]:
    """What validation logs for a task whose ``score()`` returns ``scores``."""
    return ["val/loss", *(f"val/{name}" for name in scores)]


def _unknown(name: str, known: list[str], key: str) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (f"{key}: {name!r} is not a metric this task produces ({hint}"
            f"it produces {', '.join(known)})")


def metric_problem(spec: Mapping[str, Any], scores: Iterable[str],
                   own: Iterable[str] = ()) -> str | None:
    """The first metric ``spec`` names that validation does not produce, in one line with the
    key path; None when every named metric exists. ``own``: the keys the task logs itself
    (``self.log``; its ``val/`` ones are validation's too)."""
    names = list(scores)
    logged = [*produced(names), *(k for k in own if k.startswith("val/") and k != "val/loss")]
    metric = (spec.get("validation") or {}).get("metric")
    if metric is not None and metric not in logged:
        return _unknown(metric, logged, "validation.metric")
    overfit = (spec.get("pilot") or {}).get("overfit_metric")
    if overfit is not None and overfit not in names:
        return _unknown(overfit, names, "pilot.overfit_metric")
    return None


def declared_metrics(task: Any) -> list[str] | None:
    """The names a built task declares ``score()`` returns (``metrics``: strings only; an
    attribute of that name holding anything else is the task's own business), those of
    ``campaign.Task``'s default ``score()``, or None when it does not say."""
    declared = getattr(task, "metrics", None)
    if isinstance(declared, list | tuple) and declared and all(
        isinstance(name, str) for name in declared
    ):
        return list(declared)
    defaults = getattr(type(task), "default_metrics", None)
    if declared is None and callable(defaults) and _default_score(task):
        return list(task.default_metrics())
    return None


def _default_score(task: Any) -> bool:
    """Whether ``task`` keeps ``campaign.Task``'s own ``score()``."""
    from campaign.loop.task_base import Task

    return isinstance(task, Task) and type(task).score is Task.score


# Scores where lower is better (the last part of the name, after any "val/"): the overfit
# threshold is a ceiling for these and a floor for every other score (accuracy, F1, R²).
MINIMISED = ("loss", "mse", "mae", "rmse", "nll", "perplexity", "ppl", "error", "cer", "wer")


def metric_mode(name: str) -> str:
    """``min`` for an error or a loss (mse, mae, val/loss, ...), ``max`` otherwise."""
    base = name.rsplit("/", 1)[-1].lower()
    return "min" if base in MINIMISED or base.endswith(("loss", "_error", "error_rate")) else "max"
