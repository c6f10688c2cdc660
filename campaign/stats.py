"""Paired statistics shared by the report's conclusions and a search's rungs: the paired
Student t interval and p-value over seeds, and Holm's step-down correction for several
comparisons (docs/report.md). Plain functions over lists of floats; scipy is imported only
when one is computed."""

from __future__ import annotations

import math

MIN_PAIRS = 3  # fewer pairs give no interval: "not estimable"


def paired_interval(deltas: list[float]) -> tuple[float, float] | None:
    """The 95% paired-t interval of the mean of ``deltas``; None under 3 pairs."""
    if len(deltas) < MIN_PAIRS:
        return None
    from scipy import stats  # only when one is computed

    mean = sum(deltas) / len(deltas)
    spread = math.sqrt(sum((d - mean) ** 2 for d in deltas) / (len(deltas) - 1))
    half = float(stats.t.ppf(0.975, len(deltas) - 1)) * spread / math.sqrt(len(deltas))
    return mean - half, mean + half


def paired_p(deltas: list[float]) -> float | None:
    """Two-sided p of the paired t test that the mean delta is zero (None under 3 pairs)."""
    if len(deltas) < MIN_PAIRS:
        return None
    from scipy import stats

    if all(d == deltas[0] for d in deltas):  # no spread: the test is undefined
        return 0.0 if deltas[0] != 0 else 1.0
    return float(stats.ttest_1samp(deltas, 0.0).pvalue)


def holm(p_values: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values (each at most 1, never below an earlier one)."""
    ordered = sorted(p_values, key=lambda k: p_values[k])
    adjusted, running = {}, 0.0
    for i, key in enumerate(ordered):
        running = max(running, min(1.0, (len(ordered) - i) * p_values[key]))
        adjusted[key] = running
    return adjusted
