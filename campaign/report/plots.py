"""The report's figures (matplotlib, headless Agg backend), as PNG bytes.

Every run is drawn: one panel per variant, one line per run (a diverged run
to the step where it stopped, ending in a cross), validation points as dots
on a second panel row. The pilot's phases get a memory chart (peak bytes per
phase and device; CUDA allocated and reserved apart, CPU resident set).
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # headless: no display, no GUI toolkit

import matplotlib.pyplot as plt
import pandas as pd

from campaign.report.balance import BalanceSheet

ENDED_BADLY = ("diverged", "failed", "oom", "lost", "interrupted")


def _png(figure: plt.Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
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
    for column, variant in enumerate(variants):
        top, bottom = axes[0][column], axes[1][column]
        mine = sheet.runs[sheet.runs["variant"] == variant]["run_id"]
        for run_id in mine:
            label = f"seed {seeds[run_id]} ({status[run_id]})"
            loss = curves[(curves["run_id"] == run_id) & (curves["key"] == "train/loss")]
            if len(loss):
                (line,) = top.plot(loss["step"], loss["value"], linewidth=1, label=label)
                if status[run_id] in ENDED_BADLY:
                    last = loss.dropna(subset=["value"]).tail(1)
                    top.plot(last["step"], last["value"], marker="x", markersize=9,
                             color=line.get_color())  # fmt: skip
            points = curves[(curves["run_id"] == run_id) & (curves["key"] == sheet.metric)]
            if len(points):
                bottom.plot(points["step"], points["value"], marker="o", markersize=3,
                            linewidth=0.8, label=label)  # fmt: skip
        top.set_title(str(variant))
        if _positive(curves, "train/loss"):
            top.set_yscale("log")
        top.set_xlabel("update")
        bottom.set_xlabel("update")
        top.legend(fontsize=7)
    axes[0][0].set_ylabel("train/loss")
    axes[1][0].set_ylabel(sheet.metric)
    figure.suptitle(f"{sheet.campaign['name']}: every run, diverged ones to their stop (x)")
    return _png(figure)


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
