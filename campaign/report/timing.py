"""Where a run's time went: training (updates and validation) apart from overhead.

A run's wall time is the sum of its segments (a resumed run's pause is not
counted). Each segment records the seconds it spent in updates and
validation; the rest (start-up, checkpoints, the final export and its replay
in a fresh process) is overhead. A 100-update run on a small model may train
for 2 s and spend 15 s on overhead: comparing wall times alone would mislead.
A planned run shows the time its gate class's pilot projects for it.
"""

from __future__ import annotations

import pandas as pd

from campaign.gates.classes import gate_class
from campaign.plan.time_projection import counts, latest_passing_pilot, pilot_figures, project


def run_times(segments: pd.DataFrame) -> dict[str, pd.Series]:
    """Per run id: ``wall_time_s``, ``training_s`` and ``overhead_s`` (training and overhead
    unknown, None, when a segment ended without its training time: a lost worker, an older
    ledger)."""
    ended = segments.dropna(subset=["ended_at"]) if len(segments) else segments
    if ended.empty:
        empty = pd.Series(dtype=float)
        return {"wall_time_s": empty, "training_s": empty, "overhead_s": empty}
    # None from older ledgers and API writers: a float column, NaN where unknown.
    ended = ended.assign(training_s=pd.to_numeric(ended["training_s"], errors="coerce"))
    wall = (ended["ended_at"] - ended["started_at"]).dt.total_seconds().clip(lower=0)
    by_run = ended.assign(wall=wall).groupby("run_id")
    total = by_run["wall"].sum()
    complete = by_run["training_s"].count() == by_run.size()
    training = by_run["training_s"].sum().where(complete)  # a partial sum would mislead
    overhead = (total - training).clip(lower=0)
    return {"wall_time_s": total.round(3), "training_s": training.round(3),
            "overhead_s": overhead.round(3)}


def projected_seconds(
    runs: pd.DataFrame, pilots: pd.DataFrame, phases: pd.DataFrame, spec_sha256: str
) -> list[float | None]:
    """For each planned run, the seconds its gate class's latest passing pilot projects
    (per-run fixed costs included, as ``campaign size``); None otherwise."""
    figures: dict[str, dict[str, float] | None] = {}
    projected: list[float | None] = []
    for status, config in zip(runs["status"], runs["config"], strict=True):
        try:
            count = counts(config)
            class_id = gate_class(config).id
        except (KeyError, TypeError, ValueError):  # a partial config recorded through the API
            count = None
        if status != "planned" or count is None:
            projected.append(None)
            continue
        if class_id not in figures:
            pilot_id = latest_passing_pilot(pilots, spec_sha256, class_id)
            rows = phases[phases["pilot_id"] == pilot_id] if pilot_id is not None else None
            figures[class_id] = pilot_figures(rows) if rows is not None and len(rows) else None
        found = figures[class_id]
        if found is None:
            projected.append(None)
            continue
        projected.append(round(project(runs=1, **found, **count).seconds_per_run, 3))
    return projected
