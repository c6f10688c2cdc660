"""Conclusions: each variant against the control, paired by seed, and one answer.

Per non-control variant, over the seeds where both its original run and the
control's have a value: the number of pairs, the mean delta, a 95% interval
(paired Student t, the method named in every document; fewer than 3 pairs
give no interval: "not estimable"), the seeds better and worse, and a verdict
from a fixed vocabulary (docs/report.md):

- ``better`` / ``worse``: the interval excludes zero (direction by the
  metric's mode: higher is better for ``max``);
- ``within_noise``: it does not, or it cannot be estimated;
- ``no_valid_runs``: no pair at all, with the reason in words
  ("diverged 2/2: loss_explosion at update 2").

Then one sentence that answers the campaign's question, "the control stays
best" included.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from campaign.stats import MIN_PAIRS, paired_interval

METHOD = "paired Student t"
COLUMNS = ("variant", "pairs", "mean_delta", "ci_low", "ci_high", "better", "worse", "verdict",
           "reason")
VALUED = ("completed", "stopped")  # statuses whose final metric is a result


def status_summary(runs: pd.DataFrame) -> str:
    """ "diverged 2/2: loss_explosion at update 2" for the original runs of one variant."""
    total, parts = len(runs), []
    for status, group in runs.groupby("status", sort=False):
        causes = sorted({stop_words(r) for r in group.itertuples()} - {""})
        words = {"planned": "not run yet", "withdrawn": "withdrawn"}.get(str(status))
        detail = ", ".join(causes[:3]) or words
        parts.append(f"{status} {len(group)}/{total}" + (f": {detail}" if detail else ""))
    return "; ".join(parts) or "no runs"


def stop_words(run: Any) -> str:
    """"loss_explosion at update 2" (or just the cause, or nothing for a run that never ran)."""
    if not isinstance(run.stop_cause, str):
        return ""
    if pd.isna(run.stop_step):
        return run.stop_cause
    return f"{run.stop_cause} at update {int(run.stop_step)}"


def conclusions(
    variants: pd.DataFrame, deltas: pd.DataFrame, originals: pd.DataFrame, mode: str
) -> pd.DataFrame:
    """One line per non-control variant (``originals``: the original, not withdrawn runs)."""
    sign = 1.0 if mode == "max" else -1.0
    control = variants[variants["is_control"]]
    control_name = control["variant"].iloc[0] if len(control) else None
    control_has_values = bool(len(control)) and int(control["n"].iloc[0]) > 0
    rows = []
    for row in variants[~variants["is_control"]].itertuples():
        mine = deltas[(deltas["variant"] == row.variant) & deltas["delta"].notna()]
        values = [float(v) for v in mine["delta"]]
        line: dict[str, Any] = {"variant": row.variant, "pairs": len(values), "mean_delta": None,
                                "ci_low": None, "ci_high": None,
                                "better": sum(sign * v > 0 for v in values),
                                "worse": sum(sign * v < 0 for v in values)}
        if not values:
            if not control_has_values:
                who = originals[originals["variant"] == control_name]
                reason = f"the control {control_name} has no valid run: {status_summary(who)}"
            elif int(row.n) == 0:
                reason = status_summary(originals[originals["variant"] == row.variant])
            else:
                reason = "no seed where both this variant and the control have a value"
            rows.append({**line, "verdict": "no_valid_runs", "reason": reason})
            continue
        mean = sum(values) / len(values)
        interval = paired_interval(values)
        line["mean_delta"] = mean
        if interval is None:
            verdict = "within_noise"
            reason = (f"too few seeds to estimate: {len(values)} paired "
                      f"seed{'s' * (len(values) > 1)}, an interval needs {MIN_PAIRS}")
        else:
            line["ci_low"], line["ci_high"] = interval
            if interval[0] > 0 or interval[1] < 0:
                verdict = "better" if sign * mean > 0 else "worse"
                reason = f"the 95% interval ({METHOD}) excludes zero"
            else:
                verdict, reason = "within_noise", f"the 95% interval ({METHOD}) includes zero"
        missing = int(row.planned) - len(values)
        if missing > 0:
            reason += f"; {missing} of {int(row.planned)} planned seeds not paired"
        rows.append({**line, "verdict": verdict, "reason": reason})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _delta(value: float) -> str:
    return f"{value:+.3g}"


def _verdict_words(row: Any) -> str:
    if row.verdict == "no_valid_runs":
        return f"{row.variant}: no valid runs ({row.reason})"
    text = f"{row.variant}: {row.verdict.replace('_', ' ')}, {_delta(row.mean_delta)}"
    if row.ci_low is not None and not pd.isna(row.ci_low):
        interval = f"[{_delta(row.ci_low)}, {_delta(row.ci_high)}]"
        if row.verdict == "within_noise" and (row.ci_low > 0 or row.ci_high < 0):
            # a search's verdict is Holm's over its confirmed comparisons: the interval shown is
            # each comparison's own, which alone would have excluded zero
            return (f"{row.variant}: within noise after Holm's correction, "
                    f"{_delta(row.mean_delta)} {interval} (uncorrected 95%) over {row.pairs} "
                    "seeds")
        return text + f" {interval} over {row.pairs} seeds"
    return (f"{row.variant}: too few seeds to estimate, {_delta(row.mean_delta)} over "
            f"{row.pairs} seed{'s' * (row.pairs > 1)} (an interval needs {MIN_PAIRS})")


def campaign_conclusion(
    question: str,
    control: str | None,
    table: pd.DataFrame,
    metric: str,
    mode: str,
    unfinished: int,
    flags: int,
    no_value: str | None = None,
) -> str:
    """One paragraph that answers the campaign's question from the conclusions table;
    ``flags``: the integrity flags on the runs the statistics count (a flagged relaunch or
    withdrawn run is listed with the flags, and changes no number here); ``no_value``: why
    nothing can be concluded at all (the metric was never recorded, the control has no
    value), said instead of an answer.

    "The control stays best" only when every variant is worse beyond noise; when none
    differs beyond noise, that is what it says, with the pairs it rests on."""
    direction = "higher" if mode == "max" else "lower"
    if control is None:
        return f"{question} No conclusion: the campaign has no control."
    against = f"the control {control} on {metric} ({direction} is better)"
    if no_value is not None:
        answer = f"No conclusion: {no_value}."
    elif not len(table):
        answer = f"No conclusion: the campaign has only its control {control}, nothing to compare."
    else:
        better = table[table["verdict"] == "better"].sort_values(
            "mean_delta", ascending=mode != "max")
        if len(better):
            best = better.iloc[0]
            others = [v for v in better["variant"] if v != best["variant"]]
            answer = (f"{best['variant']} beats {against}: "
                      f"mean delta {_delta(best['mean_delta'])}, 95% interval "
                      f"[{_delta(best['ci_low'])}, {_delta(best['ci_high'])}] "
                      f"({METHOD}, {best['pairs']} paired seeds).")
            if others:
                answer += f" Also better: {', '.join(others)}."
        elif (table["verdict"] == "worse").all():
            answer = (f"The control {control} stays best on {metric}: every variant is worse "
                      "beyond noise.")
        elif (table["verdict"] == "worse").any():
            answer = f"No variant beats the control {control} beyond noise on {metric}."
        elif (table["verdict"] == "within_noise").any():
            noise = table[table["verdict"] == "within_noise"]
            if noise["ci_low"].isna().all():  # no interval anywhere: no verdict to give
                answer = (f"No conclusion on {metric}: too few seeds to estimate "
                          f"({_pairs(noise)}; an interval needs {MIN_PAIRS}).")
            else:
                answer = (f"No variant differs from the control {control} beyond noise on "
                          f"{metric} ({_pairs(noise)}).")
        else:  # every variant without a valid run: nothing was compared
            answer = f"No conclusion: no variant has a value to compare with the control {control}."
        rest = [_verdict_words(r) for r in table.itertuples() if r.verdict != "better"]
        if rest:
            answer += " " + "; ".join(rest) + "."
    if unfinished:
        runs = "1 planned run has" if unfinished == 1 else f"{unfinished} planned runs have"
        answer += f" {runs} not finished: this may change."
    if flags:
        answer += (f" {flags} integrity flag{'s' * (flags > 1)} on the runs counted here: "
                   "read them before relying on this.")
    return f"{question} {answer}".strip()


def _pairs(table: pd.DataFrame) -> str:
    """ "3 pairs" (or "2-5 pairs" when the variants have different counts)."""
    low, high = int(table["pairs"].min()), int(table["pairs"].max())
    count = str(low) if low == high else f"{low}-{high}"
    words = f"{count} pair{'s' * (high != 1)}"
    return f"{words} each" if len(table) > 1 else words


def no_value_reason(
    control: pd.DataFrame, originals: pd.DataFrame, metric: str, recorded: list[str]
) -> str | None:
    """Why no conclusion is possible at all: no run recorded the metric although runs
    finished (a metric validation never produced), or the control has no value."""
    finished = originals["status"].isin(VALUED)
    if finished.any() and originals["final_metric"].isna().all():
        logged = [k for k in recorded if k.startswith("val/")]
        return (f"no run recorded {metric}, the campaign's validation.metric (the runs recorded "
                f"{', '.join(logged) or 'no validation metric'})")
    if len(control) and int(control["n"].iloc[0]) == 0:
        name = control["variant"].iloc[0]
        who = originals[originals["variant"] == name]
        return f"the control {name} has no valid run: {status_summary(who)}"
    return None
