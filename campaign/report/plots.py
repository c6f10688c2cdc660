"""The report's figures (matplotlib, headless Agg backend), as PNG bytes.

Every run is drawn: one panel per variant, one line per run (a diverged run
to the step where it stopped, ending in a cross), validation points as dots
on a second panel row. The pilot's phases get a memory chart (peak bytes per
phase and device; CUDA allocated and reserved apart, CPU resident set).
"""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display, no GUI toolkit

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.collections import LineCollection

from campaign.report.balance import BalanceSheet

ENDED_BADLY = ("diverged", "failed", "oom", "lost", "interrupted")
MANY = 12  # runs in a panel beyond which lines are drawn as one collection, without a legend


def _png(figure: plt.Figure) -> bytes:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return buffer.getvalue()


def loss_curves(sheet: BalanceSheet) -> bytes | None:
    """Training loss (top) and the validation metric (bottom) per variant, every run drawn."""
    curves = sheet.curves
    if curves.empty:
        return None
    variants = list(sheet.variants["variant"]) if len(sheet.variants) else []
    figure, axes = plt.subplots(2, max(1, len(variants)), squeeze=False, sharey="row", sharex=True,
                                figsize=(4.2 * max(1, len(variants)), 6.4))  # fmt: skip
    status = sheet.runs.set_index("run_id")["status"]
    seeds = sheet.runs.set_index("run_id")["seed"]
    # One pass over the points (not one scan per run): a thousand runs stay quick.
    series = {key: frame for key, frame in curves.groupby(["run_id", "key"], sort=False)}
    for column, variant in enumerate(variants):
        top, bottom = axes[0][column], axes[1][column]
        mine = sheet.runs[sheet.runs["variant"] == variant]["run_id"]
        if len(mine) > MANY:
            _draw_many(top, bottom, mine, series, status, sheet.metric)
        else:
            _draw_each(top, bottom, mine, series, status, seeds, sheet.metric)
        top.set_title(str(variant))
        if _positive(curves, "train/loss"):
            top.set_yscale("log")
        top.set_xlabel("update")
        bottom.set_xlabel("update")
        if len(mine) <= MANY:  # beyond that a legend hides the curves; the run table names them
            top.legend(fontsize=7)
    axes[0][0].set_ylabel("train/loss")
    axes[1][0].set_ylabel(sheet.metric)
    figure.suptitle(f"{sheet.campaign['name']}: every run, diverged ones to their stop (x)")
    return _png(figure)


def _draw_each(top: Any, bottom: Any, runs: pd.Series, series: dict[Any, pd.DataFrame],
               status: pd.Series, seeds: pd.Series, metric: str) -> None:  # fmt: skip
    """A few runs: one labelled line each."""
    for run_id in runs:
        label = f"seed {seeds[run_id]} ({status[run_id]})"
        loss = series.get((run_id, "train/loss"))
        if loss is not None:
            (line,) = top.plot(loss["step"], loss["value"], linewidth=1, label=label)
            if status[run_id] in ENDED_BADLY:
                _cross(top, loss, line.get_color())
        points = series.get((run_id, metric))
        if points is not None:
            bottom.plot(points["step"], points["value"], marker="o", markersize=3,
                        linewidth=0.8, label=label)  # fmt: skip


def _draw_many(top: Any, bottom: Any, runs: pd.Series, series: dict[Any, pd.DataFrame],
               status: pd.Series, metric: str) -> None:  # fmt: skip
    """Many runs: every line still drawn, as one collection per panel (fast at 1,000 runs)."""
    for axis, key in ((top, "train/loss"), (bottom, metric)):
        lines = [series[(r, key)][["step", "value"]].dropna().to_numpy()
                 for r in runs if (r, key) in series]  # fmt: skip
        if lines:
            axis.add_collection(LineCollection(lines, linewidths=0.6, alpha=0.5))
            axis.autoscale_view()
    for run_id in runs:
        loss = series.get((run_id, "train/loss"))
        if loss is not None and status[run_id] in ENDED_BADLY:
            _cross(top, loss, "crimson")


def _cross(axis: Any, loss: pd.DataFrame, color: Any) -> None:
    last = loss.dropna(subset=["value"]).tail(1)
    axis.plot(last["step"], last["value"], marker="x", markersize=9, color=color)


def _positive(curves: pd.DataFrame, key: str) -> bool:
    values = curves[curves["key"] == key]["value"].dropna()
    return bool(len(values)) and bool((values > 0).all())


def phase_memory(sheet: BalanceSheet) -> bytes | None:
    """Peak memory per pilot phase (bytes), one bar group per phase."""
    phases = sheet.phases
    if phases.empty:
        return None
    columns = [c for c in ("allocated_peak", "reserved_peak", "rss_peak")
               if phases[c].notna().any()]  # fmt: skip
    if not columns:
        return None
    table = phases.groupby("phase", sort=False)[columns].max() / 2**20
    figure, axis = plt.subplots(figsize=(7.5, 3.6))
    table.plot.bar(ax=axis, rot=30)
    axis.set_ylabel("MiB (peak)")
    axis.set_title("pilot: peak memory per phase")
    return _png(figure)
