"""The report's figures (matplotlib, headless Agg backend), as PNG bytes.

One chart per metric with every variant in it: the mean over the seeds that
count (original runs with a value), a min-max band, and a thin line per
seed, the control first and the variants in the run table's order (by their
axis value). A diverged run is drawn to the step where it stopped but
clipped to the healthy runs' range, with a marker where it left the range
and a cross where it stopped, so one excursion to 1e6 cannot flatten every
healthy curve. The pilot's memory chart shows what differs between phases
(on CPU, the RSS peak above every earlier phase's peak), not equal bars of process size.
Relaunches are dashed grey lines with their own legend entry: never a variant's seed.
"""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display, no GUI toolkit

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib import patheffects
from matplotlib.collections import LineCollection
from matplotlib.ticker import MaxNLocator

from campaign.report.balance import BalanceSheet
from campaign.report.conclusions import VALUED

ENDED_BADLY = ("diverged", "failed", "oom", "lost", "interrupted")
MANY = 12  # seeds in a variant beyond which its lines are drawn as one collection


def _png(figure: plt.Figure) -> bytes:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return buffer.getvalue()


def metric_chart(sheet: BalanceSheet, key: str) -> bytes | None:
    """Every variant's curves of ``key`` in one chart; None when no run logged it."""
    points = sheet.curves[(sheet.curves["key"] == key) & sheet.curves["value"].notna()]
    if points.empty:
        return None
    runs = sheet.runs[sheet.runs["status"] != "withdrawn"]
    valued = runs[runs["original"] & runs["status"].isin(VALUED)]
    counted = valued if sheet.search is None else (  # a search counts its confirmation runs
        valued[valued["seed"].isin(sheet.search["confirm_seeds"])])  # alone, as its tables
    series = _arrays(points)
    healthy = points[points["run_id"].isin(valued["run_id"])]["value"]  # the search's too
    low, high = _range(healthy if len(healthy) else points["value"])
    logarithmic = key.endswith("loss") and low > 0 and high / low > 20
    figure, axis = plt.subplots(figsize=(9.5, 4.2))
    colours = plt.get_cmap("tab10")
    relaunched = [series[r] for r in runs[~runs["original"]]["run_id"] if r in series]
    if relaunched:  # their own look and legend entry: never read as a variant's seed
        clipped = [np.column_stack([x, np.clip(y, low, high)]) for x, y in relaunched]
        axis.add_collection(LineCollection(clipped, colors=["0.45"], linewidths=0.8,
                                           linestyles="--"))
        axis.plot([], [], color="0.45", linestyle="--",
                  label=f"relaunches ({len(relaunched)}, never pooled)")
    originals = runs[runs["original"]]
    for index, variant in enumerate(dict.fromkeys(runs["variant"])):
        colour = colours(index % 10)
        mine = originals[originals["variant"] == variant]
        if mine.empty:
            continue
        _seed_lines(axis, [series[r] for r in mine["run_id"] if r in series], colour,
                    len(mine) > MANY)
        for run_id, status in zip(mine["run_id"], mine["status"], strict=True):
            if run_id in series and status in ENDED_BADLY:
                _clipped_end(axis, *series[run_id], low, high, colour)
        good = counted[counted["variant"] == variant]["run_id"]
        chosen = points[points["run_id"].isin(good)]
        if len(chosen):  # per step over the counted seeds (one point per run and step)
            band = chosen.groupby("step")["value"].agg(["min", "max", "mean"])
            axis.fill_between(band.index, band["min"], band["max"], color=colour, alpha=0.15,
                              linewidth=0)
            control = bool(mine["is_control"].iloc[0])
            label = f"{variant}{' (control)' if control else ''}"
            # The control on top of every variant (drawn first, it was hidden under one
            # with near-equal values), marked by its width and a dark outline.
            axis.plot(band.index, band["mean"], color=colour, linewidth=3.2 if control else 2.2,
                      zorder=6 if control else 4, label=f"{label}: mean of "
                      f"{chosen['run_id'].nunique()}",
                      path_effects=[patheffects.withStroke(linewidth=5, foreground="black")]
                      if control else None)
        elif sheet.search is not None:  # its search seeds' lines only, for now or for good
            axis.plot([], [], color=colour, linewidth=0.7,
                      label=f"{variant}: {search_label(sheet.search, variant, mine)}")
        else:
            axis.plot([], [], color=colour, linewidth=2.2, label=f"{variant}: no valid run")
    axis.autoscale_view()
    margin = (high - low) * 0.05 or abs(high) * 0.05 or 0.05
    if logarithmic:
        axis.set_yscale("log")
        axis.set_ylim(low / 1.3, high * 1.3)
    else:
        axis.set_ylim(low - margin, high + margin)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlabel("update")
    axis.set_ylabel(key)
    counted_words = ("counted seeds" if sheet.search is None else
                     "confirmation seeds (a search's counted runs)")
    axis.set_title(f"{key}: mean over {counted_words}, min-max band, thin line per seed; "
                   "^ left the range, x stopped", fontsize=9)
    axis.legend(fontsize=8, loc="best")
    axis.grid(alpha=0.3)
    return _png(figure)


def search_label(search: dict[str, Any], variant: str, runs: pd.DataFrame) -> str:
    """A search's variant without a confirmation value yet: chosen (or the control), its
    confirmation is pending; else it was searched and never confirmed."""
    searched = f"search runs ({int(runs['seed'].isin(search['search_seeds']).sum())})"
    chosen = search["confirmation"]["chosen"]
    if variant in chosen or bool(runs["is_control"].any()):
        return f"{searched}, confirmation pending"
    return f"{searched}, not confirmed" if chosen else searched  # chosen at the search's end


def _range(values: pd.Series) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    if finite.empty:
        return 0.0, 1.0
    return float(finite.min()), float(finite.max())


def _arrays(points: pd.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """run id -> (steps, values) sorted by step, in one sort and one split (not a pandas
    operation per run: a thousand runs stay quick)."""
    ordered = points.sort_values(["run_id", "step"], kind="stable")
    ids = ordered["run_id"].to_numpy()
    steps = ordered["step"].to_numpy(dtype=float)
    values = ordered["value"].to_numpy(dtype=float)
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    ends = np.r_[starts[1:], len(ids)]
    return {ids[a]: (steps[a:b], values[a:b]) for a, b in zip(starts, ends, strict=True)}


def _seed_lines(axis: Any, lines: list[tuple[np.ndarray, np.ndarray]], colour: Any,
                many: bool) -> None:
    if many:  # one collection: fast at a thousand runs
        arrays = [np.column_stack(line) for line in lines]
        axis.add_collection(LineCollection(arrays, colors=[colour], linewidths=0.5, alpha=0.3))
        return
    for steps, values in lines:  # a run with one point (pruned at its first rung): a dot
        axis.plot(steps, values, color=colour, linewidth=0.7, alpha=0.45,
                  marker="." if len(steps) == 1 else None)


def _clipped_end(axis: Any, steps: np.ndarray, values: np.ndarray, low: float, high: float,
                 colour: Any) -> None:
    """Markers for a run that ended badly: where it left the healthy range, where it stopped."""
    outside = np.flatnonzero((values < low) | (values > high) | ~np.isfinite(values))
    if len(outside):
        first = outside[0]
        edge = high if not values[first] < low else low
        axis.plot(steps[first], edge, marker="^" if edge == high else "v", color=colour,
                  markersize=9, markeredgecolor="black")
    last = np.clip(values[-1], low, high) if np.isfinite(values[-1]) else high
    axis.plot(steps[-1], last, marker="x", color=colour, markersize=10, markeredgewidth=2)


def phase_memory(sheet: BalanceSheet) -> tuple[bytes | None, str]:
    """What each pilot phase adds to memory; (None, why) when there is nothing to show."""
    phases = sheet.phases
    if phases.empty:
        return None, "no pilot has run yet: `campaign pilot CAMPAIGN` measures every phase"
    phases = phases[phases["pilot_id"] == phases["pilot_id"].max()]  # one pilot: one process
    series: dict[str, pd.Series] = {}
    if phases["allocated_peak"].notna().any():
        added = phases["allocated_peak"] - phases["baseline_allocated"].fillna(0)
        series["CUDA allocated above the phase's baseline"] = added.groupby(phases["phase"]).max()
    if phases["rss_peak"].notna().any():
        # The process keeps what earlier phases allocated: a phase adds what its peak has
        # above every earlier phase's peak (phases run in the order listed).
        peak = phases.groupby("phase", sort=False)["rss_peak"].max()
        before = peak.cummax().shift(1).fillna(peak.iloc[0])
        series["CPU RSS peak above every earlier phase's"] = (peak - before).clip(lower=0)
    if not series:
        return None, "the pilot recorded no memory counters"
    table = pd.DataFrame(series).reindex(list(dict.fromkeys(phases["phase"]))) / 2**20
    if float(table.abs().max().max()) < 1:
        return None, "no phase adds 1 MiB or more to memory: memory is not a constraint"
    figure, axis = plt.subplots(figsize=(8, 3.4))
    table.plot.barh(ax=axis)
    axis.invert_yaxis()
    axis.set_xlabel("MiB")
    axis.set_title(f"pilot id {int(phases['pilot_id'].iloc[0])} (gate class "
                   f"{phases['gate_class'].iloc[0]}): what each phase adds to memory",
                   fontsize=10)
    axis.legend(fontsize=8)
    return _png(figure), ""
