"""The balance sheet: every run on its line, per-variant counts and spread, deltas to the control.

Nothing is omitted: diverged, failed, out-of-memory, interrupted, lost and
still-planned runs keep their line and are counted, so the per-variant counts
always add up to the runs planned. The validation metric is summarised over
seeds as mean, standard deviation, min, max, n and every individual value
(never only the best seed), and compared with the control seed by seed.
Built from the ledger's reads only, as pandas DataFrames.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from campaign.config_keys import held_deviations
from campaign.ledger import Ledger

COUNTED = ("completed", "diverged", "failed")
RUN_COLUMNS = (
    "run_id", "variant", "is_control", "seed", "status", "stop_cause", "stop_step",
    "stop_phase", "stop_detail", "updates_planned", "updates_done", "examples_seen",
    "final_metric", "final_metric_step", "best_metric", "best_metric_step", "wall_time_s",
    "peak_allocated_bytes", "peak_rss_bytes", "relaunch_of", "relaunch_reason", "deviation",
)  # fmt: skip


@dataclass
class BalanceSheet:
    """The frames of a campaign's report (each a pandas DataFrame) and what they describe."""

    campaign: dict[str, Any]
    metric: str
    mode: str
    runs: pd.DataFrame
    variants: pd.DataFrame
    deltas: pd.DataFrame
    phases: pd.DataFrame
    notes: pd.DataFrame
    curves: pd.DataFrame = field(repr=False)

    def frames(self) -> dict[str, pd.DataFrame]:
        return {"runs": self.runs, "variants": self.variants, "deltas": self.deltas,
                "phases": self.phases, "notes": self.notes}  # fmt: skip


def balance_sheet(ledger: Ledger, campaign: str) -> BalanceSheet:
    """Read ``campaign`` from the ledger and build its balance sheet."""
    record = ledger.campaign(campaign)
    spec = record.spec_document
    runs = ledger.runs(campaign)
    validation = _validation(spec, runs)
    metric, mode = validation["metric"], validation["mode"]
    curves = ledger.metrics(campaign, keys=["train/loss", metric])
    table = _run_table(ledger, campaign, runs, curves, metric, mode, spec.get("hold", {}))
    return BalanceSheet(
        campaign={"name": record.name, "question": record.question, "task": record.task,
                  "spec_sha256": record.spec_sha256, "created_at": record.created_at},
        metric=metric,
        mode=mode,
        runs=table,
        variants=_variant_table(table),
        deltas=_deltas(table),
        phases=_pilot_phases(ledger, campaign),
        notes=ledger.notes(campaign),
        curves=curves,
    )  # fmt: skip


def _validation(spec: dict[str, Any], runs: pd.DataFrame) -> dict[str, str]:
    found = spec.get("validation") or {}
    if not found and len(runs):
        found = runs["config"].iloc[0].get("validation", {})
    return {"metric": found.get("metric", "val/loss"), "mode": found.get("mode", "min")}


def _run_table(
    ledger: Ledger,
    campaign: str,
    runs: pd.DataFrame,
    curves: pd.DataFrame,
    metric: str,
    mode: str,
    hold: dict[str, Any],
) -> pd.DataFrame:
    table = runs[["run_id", "variant", "is_control", "seed", "status", "stop_cause",
                  "stop_step", "stop_phase", "stop_detail", "relaunch_of",
                  "relaunch_reason"]].copy()  # fmt: skip
    # Runs recorded through the API (notebooks) may carry a partial config.
    budgets = [c.get("budget") or {} for c in runs["config"]]
    table["updates_planned"] = [int(b.get("updates") or 0) for b in budgets]
    table["deviation"] = [", ".join(held_deviations(c, hold)) or None for c in runs["config"]]
    loss = curves[curves["key"] == "train/loss"]
    done = loss.groupby("run_id")["step"].max()
    seen = loss.groupby("run_id")["examples_seen"].max()
    table["updates_done"] = table["run_id"].map(done).fillna(0).astype(int)
    table["examples_seen"] = table["run_id"].map(seen).fillna(0).astype(int)
    points = curves[(curves["key"] == metric) & curves["value"].notna()].sort_values("step")
    final = points.groupby("run_id").last()
    best_index = (points.groupby("run_id")["value"].idxmax() if mode == "max"
                  else points.groupby("run_id")["value"].idxmin())  # fmt: skip
    best = points.loc[best_index.to_numpy()].set_index("run_id") if len(points) else final
    table["final_metric"] = table["run_id"].map(final["value"])
    table["final_metric_step"] = table["run_id"].map(final["step"]).astype("Int64")
    table["best_metric"] = table["run_id"].map(best["value"])
    table["best_metric_step"] = table["run_id"].map(best["step"]).astype("Int64")
    table["wall_time_s"] = table["run_id"].map(_wall_times(ledger, campaign))
    peaks = _peaks(ledger, campaign)
    table["peak_allocated_bytes"] = table["run_id"].map(peaks["allocated"]).astype("Int64")
    table["peak_rss_bytes"] = table["run_id"].map(peaks["rss"]).astype("Int64")
    table["stop_step"] = table["stop_step"].astype("Int64")
    return table[list(RUN_COLUMNS)].sort_values(["variant", "seed", "run_id"]).reset_index(
        drop=True
    )


def _wall_times(ledger: Ledger, campaign: str) -> pd.Series:
    """Seconds spent running, summed over a run's segments (a resumed run's pause excluded)."""
    segments = ledger.segments(campaign)
    if segments.empty:
        return pd.Series(dtype=float)
    ended = segments.dropna(subset=["ended_at"])
    seconds = (ended["ended_at"] - ended["started_at"]).dt.total_seconds()
    return seconds.groupby(ended["run_id"]).sum().round(3)


def _peaks(ledger: Ledger, campaign: str) -> dict[str, pd.Series]:
    phases = ledger.phases(campaign)
    phases = phases[phases["run_id"].notna()]
    if phases.empty:
        return {"allocated": pd.Series(dtype=float), "rss": pd.Series(dtype=float)}
    by_run = phases.groupby("run_id")
    return {"allocated": by_run["allocated_peak"].max(), "rss": by_run["rss_peak"].max()}


def _variant_table(runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for variant, group in runs.groupby("variant", sort=False):
        values = group.dropna(subset=["final_metric"]).sort_values("seed")
        numbers = values["final_metric"].astype(float)
        counts = {status: int((group["status"] == status).sum()) for status in COUNTED}
        rows.append({
            "variant": variant,
            "is_control": bool(group["is_control"].iloc[0]),
            "planned": len(group),
            **counts,
            "other": len(group) - sum(counts.values()),
            "n": len(numbers),
            "mean": float(numbers.mean()) if len(numbers) else None,
            "std": float(numbers.std(ddof=1)) if len(numbers) > 1 else None,
            "min": float(numbers.min()) if len(numbers) else None,
            "max": float(numbers.max()) if len(numbers) else None,
            "values": json.dumps({str(int(s)): float(f"{v:.6g}") for s, v in
                                  zip(values["seed"], numbers, strict=True)}),
        })  # fmt: skip
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    return frame.sort_values(["is_control", "variant"], ascending=[False, True]).reset_index(
        drop=True
    )


def _deltas(runs: pd.DataFrame) -> pd.DataFrame:
    """Each variant's final metric minus the control's, seed by seed (original runs only:
    a relaunch answers for itself in the run table)."""
    originals = runs[runs["relaunch_of"].isna()]
    control = originals[originals["is_control"]].set_index("seed")["final_metric"]
    rows = []
    for r in originals[~originals["is_control"]].itertuples():
        mine, base = r.final_metric, control.get(r.seed, np.nan)
        delta = mine - base if pd.notna(mine) and pd.notna(base) else None
        rows.append({"variant": r.variant, "seed": int(r.seed), "run_id": r.run_id,
                     "metric": mine, "control": base, "delta": delta})  # fmt: skip
    return pd.DataFrame(rows, columns=["variant", "seed", "run_id", "metric", "control", "delta"])


def _pilot_phases(ledger: Ledger, campaign: str) -> pd.DataFrame:
    """The latest pilot's measurement per phase (what each phase cost before launch)."""
    pilots = ledger.pilots(campaign)
    phases = ledger.phases(campaign)
    if pilots.empty or phases.empty:
        return pd.DataFrame(columns=["phase", "device", "duration_s", "allocated_peak",
                                     "reserved_peak", "rss_peak", "verdict", "detail"])  # fmt: skip
    latest = int(pilots["pilot_id"].iloc[-1])
    mine = phases[phases["pilot_id"] == latest]
    return mine[["phase", "device", "duration_s", "allocated_peak", "reserved_peak", "rss_peak",
                 "verdict", "detail"]].reset_index(drop=True)  # fmt: skip
