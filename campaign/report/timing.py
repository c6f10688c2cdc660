"""Where a run's time went: training (updates and validation) apart from overhead.

A run's wall time is the sum of its segments (a resumed run's pause is not
counted). Each segment records the seconds it spent in updates and
validation; the rest (start-up, checkpoints, the final export and its replay
in a fresh process) is overhead. A 100-update run on a small model may train
for 2 s and spend 15 s on overhead: comparing wall times alone would mislead.
A planned run shows the time the pilot's measurements project for it.
"""

from __future__ import annotations

import pandas as pd

from campaign.projection import counts, project


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
            "overhead_s": overhead.round(3)}  # fmt: skip


def projected_seconds(
    runs: pd.DataFrame, pilots: pd.DataFrame, phases: pd.DataFrame, spec_sha256: str
) -> list[float | None]:
    """For each planned run, the seconds the latest passing pilot projects; None otherwise."""
    passed = pilots[(pilots["config_sha256"] == spec_sha256) & (pilots["verdict"] == "pass")]
    if passed.empty or phases.empty:
        return [None] * len(runs)
    latest = phases[phases["pilot_id"] == passed["pilot_id"].iloc[-1]]
    duration = latest.groupby("phase")["duration_s"].max().to_dict()
    if not {"update", "validation", "checkpoint"} <= duration.keys():
        return [None] * len(runs)
    projected: list[float | None] = []
    for status, config in zip(runs["status"], runs["config"], strict=True):
        try:
            count = counts(config)
        except (KeyError, TypeError, ValueError):  # a partial config recorded through the API
            count = None
        if status != "planned" or count is None:
            projected.append(None)
            continue
        per_run = project(update_s=float(duration["update"]),
                          validation_s=float(duration["validation"]),
                          checkpoint_s=float(duration["checkpoint"]), runs=1, **count)  # fmt: skip
        projected.append(round(per_run.seconds_per_run, 3))
    return projected
