"""The balance sheet: every run on its line, variants counted by the rules, conclusions, flags.

Counting rules (docs/report.md, contract): a variant's statistics are over its
originally planned runs, one per seed. A planned seed without a value
(diverged, failed, oom, lost, never run) is counted by its status and never
dropped; withdrawn runs keep their line and count nowhere; relaunches are
never pooled into a variant, each has its line in ``relaunches`` with its
lineage and full config difference. Deltas against the control are seed by
seed over original runs, and the conclusions pair them. Built from the
ledger's reads only, as pandas DataFrames.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from campaign.ledger import LedgerReader
from campaign.plan.config_keys import held_deviations
from campaign.report.conclusions import (
    VALUED,
    campaign_conclusion,
    conclusions,
    no_value_reason,
    stop_words,
)
from campaign.report.flags import exceeds_budget, integrity_flags
from campaign.report.relaunches import defining_keys, lineage, relaunch_table
from campaign.report.search_section import (
    confirmed_words,
    holm_verdicts,
    search_section,
    unconfirmed,
)
from campaign.report.timing import projected_seconds, run_times
from campaign.search.state import read_state

COUNTED = ("completed", "diverged", "failed")
RUN_COLUMNS = (
    "run_id", "variant", "is_control", "seed", "original", "status", "stop_cause", "stop_step",
    "stop_phase", "stop_detail", "updates_planned", "updates_done", "examples_seen",
    "final_metric", "final_metric_step", "best_metric", "best_metric_step", "training_s",
    "overhead_s", "data_wait_s", "input_bound", "wall_time_s", "projected_s",
    "peak_allocated_bytes", "peak_rss_bytes",
    "relaunch_of", "relaunch_reason", "lineage", "deviation", "flags",
)


@dataclass
class BalanceSheet:
    """The frames of a campaign's report (each a pandas DataFrame) and what they describe."""

    campaign: dict[str, Any]
    metric: str
    mode: str
    conclusion: str
    runs: pd.DataFrame
    variants: pd.DataFrame
    deltas: pd.DataFrame
    relaunches: pd.DataFrame
    conclusions: pd.DataFrame
    flags: pd.DataFrame
    phases: pd.DataFrame
    notes: pd.DataFrame
    curves: pd.DataFrame = field(repr=False)
    search: dict[str, Any] | None = None  # a search's section (report/search_section.py)

    def frames(self) -> dict[str, pd.DataFrame]:
        return {"runs": self.runs, "variants": self.variants, "deltas": self.deltas,
                "relaunches": self.relaunches, "conclusions": self.conclusions,
                "flags": self.flags, "phases": self.phases, "notes": self.notes}


def balance_sheet(ledger: LedgerReader, campaign: str) -> BalanceSheet:
    """Read ``campaign`` from the ledger and build its balance sheet."""
    record = ledger.campaign(campaign)
    spec = record.spec_document
    runs = ledger.runs(campaign)
    validation = _validation(spec, runs)
    metric, mode = validation["metric"], validation["mode"]
    curves = ledger.metrics(campaign, keys=["train/loss", metric])
    pilots, phases, events = (
        ledger.pilots(campaign),
        ledger.phases(campaign),
        ledger.events(campaign),
    )
    keys = defining_keys(runs)
    runs = runs.iloc[_run_order(runs, keys)].reset_index(drop=True)
    table = _run_table(runs, curves, mode, metric, spec.get("hold", {}))
    times = run_times(ledger.segments(campaign))
    for column in ("training_s", "overhead_s", "wall_time_s"):
        table[column] = table["run_id"].map(times[column])
    # Input-bound share: the time updates waited for their batches, of the training time.
    table["data_wait_s"] = table["run_id"].map(ledger.metric_totals(campaign,
                                                                    "train/data_wait_s"))
    table["input_bound"] = (table["data_wait_s"] / table["training_s"]).round(3)
    table["projected_s"] = pd.Series(projected_seconds(runs, pilots, phases, record.spec_sha256),
                                     dtype="float64")
    peaks = _peaks(phases)
    table["peak_allocated_bytes"] = table["run_id"].map(peaks["allocated"]).astype("Int64")
    table["peak_rss_bytes"] = table["run_id"].map(peaks["rss"]).astype("Int64")
    relaunches = relaunch_table(runs, dict(zip(table["run_id"], table["final_metric"],
                                               strict=True)), keys)
    context = table.assign(config=runs["config"], environment=runs["environment"],
                           started_at=runs["started_at"])
    flags = integrity_flags(context, events, pilots, record.spec_sha256, spec.get("hold", {}),
                            relaunches)
    kinds = flags.groupby("run_id")["kind"].agg(lambda k: ", ".join(dict.fromkeys(k)))
    table["flags"] = table["run_id"].map(kinds)
    table = table[list(RUN_COLUMNS)]
    state = read_state(ledger, campaign)  # a search: its conclusion from confirmation alone
    counted = table if state is None else table[table["seed"].isin(state.plan.confirm_seeds)]
    originals = counted[counted["original"] & (counted["status"] != "withdrawn")]
    variants = _variant_table(counted)
    deltas = _deltas(originals)
    verdicts = conclusions(variants, deltas, originals, mode)
    search, no_value = None, None
    if state is not None:
        verdicts, tests = holm_verdicts(verdicts, deltas, mode)
        search = search_section(state, verdicts, tests)
        no_value = unconfirmed(state, originals)
    control = variants[variants["is_control"]]["variant"] if len(variants) else pd.Series(
        [] if state is None else [state.control], dtype=object)
    everything = table[table["original"]]
    unfinished = int(everything["status"].isin(("planned", "running", "interrupted",
                                                "lost")).sum())
    conclusion = campaign_conclusion(
        record.question, control.iloc[0] if len(control) else None, verdicts, metric, mode,
        unfinished, int(flags["run_id"].isin(originals["run_id"]).sum()),
        no_value or no_value_reason(variants[variants["is_control"]], originals, metric,
                                    ledger.metric_keys(campaign) if len(originals) else []),
    )
    if search is not None and no_value is None:
        conclusion += confirmed_words(search)
    return BalanceSheet(
        campaign={"name": record.name, "question": record.question, "task": record.task,
                  "spec_sha256": record.spec_sha256, "created_at": record.created_at},
        metric=metric,
        mode=mode,
        conclusion=conclusion,
        runs=table,
        variants=variants,
        deltas=deltas,
        relaunches=relaunches,
        conclusions=verdicts,
        flags=flags,
        phases=_pilot_phases(pilots, phases),
        notes=ledger.notes(campaign),
        curves=curves,
        search=search,
    )


def _validation(spec: dict[str, Any], runs: pd.DataFrame) -> dict[str, str]:
    found = spec.get("validation") or {}
    if not found and len(runs):
        found = runs["config"].iloc[0].get("validation", {})
    return {"metric": found.get("metric", "val/loss"), "mode": found.get("mode", "min")}


def _sortable(value: Any) -> tuple[int, Any]:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return (1, str(value))
    return (0, float(value))


def _run_order(runs: pd.DataFrame, keys: set[str]) -> list[int]:
    """Control first, then variants by their defining keys' values (lr 3e-4 before 1e-3
    before 3e-3, not as text); within a variant by seed, each original before its relaunches."""
    from campaign.plan.config_keys import config_value

    first = runs[runs["relaunch_of"].isna()].drop_duplicates("variant").set_index("variant")
    ordered = sorted(keys)
    rank = {
        name: (not bool(row["is_control"]),
               tuple(_sortable(config_value(row["config"], k)) for k in ordered), name)
        for name, row in first.iterrows()
    }
    chains = lineage(runs)
    variants, seeds = runs["variant"].tolist(), runs["seed"].tolist()
    ids, created = runs["run_id"].tolist(), runs["created_at"].tolist()
    return sorted(range(len(runs)), key=lambda i: (
        rank.get(variants[i], (True, (), variants[i])), int(seeds[i]), len(chains[ids[i]]),
        created[i]))


def _run_table(
    runs: pd.DataFrame, curves: pd.DataFrame, mode: str, metric: str, hold: dict[str, Any]
) -> pd.DataFrame:
    table = runs[["run_id", "variant", "is_control", "seed", "status", "stop_cause",
                  "stop_step", "stop_phase", "stop_detail", "relaunch_of",
                  "relaunch_reason"]].copy()
    table["is_control"] = table["is_control"].astype(bool)
    # One original per (variant, seed), the earliest: the ledger refuses a second one (0006)
    # and marks those an older ledger held (``duplicate_of``); they keep a line, uncounted.
    first = ~table.duplicated(["variant", "seed"]) if len(table) else table["run_id"].isna()
    unmarked = runs["duplicate_of"].isna() if "duplicate_of" in runs else True
    table["original"] = table["relaunch_of"].isna() & unmarked & first
    # Runs recorded through the API (notebooks) may carry a partial config.
    budgets = [c.get("budget") or {} for c in runs["config"]]
    table["updates_planned"] = [int(b.get("updates") or 0) for b in budgets]
    table["deviation"] = [", ".join(held_deviations(c, hold)) or None for c in runs["config"]]
    chains = lineage(runs)
    table["lineage"] = [" -> ".join(chains[r]) if len(chains[r]) > 1 else None
                        for r in table["run_id"]]
    loss = curves[curves["key"] == "train/loss"]
    table["updates_done"] = table["run_id"].map(loss.groupby("run_id")["step"].max())
    table["updates_done"] = table["updates_done"].fillna(0).astype(int)
    seen = loss.groupby("run_id")["examples_seen"].max()
    table["examples_seen"] = table["run_id"].map(seen).fillna(0).astype(int)
    points = curves[(curves["key"] == metric) & curves["value"].notna()].sort_values("step")
    final = points.groupby("run_id").last()
    best_index = (points.groupby("run_id")["value"].idxmax() if mode == "max"
                  else points.groupby("run_id")["value"].idxmin())
    best = points.loc[best_index.to_numpy()].set_index("run_id") if len(points) else final
    table["final_metric"] = table["run_id"].map(final["value"])
    table["final_metric_step"] = table["run_id"].map(final["step"]).astype("Int64")
    table["best_metric"] = table["run_id"].map(best["value"])
    table["best_metric_step"] = table["run_id"].map(best["step"]).astype("Int64")
    table["stop_step"] = table["stop_step"].astype("Int64")
    return table


def _peaks(phases: pd.DataFrame) -> dict[str, pd.Series]:
    mine = phases[phases["run_id"].notna()] if len(phases) else phases
    if mine.empty:
        return {"allocated": pd.Series(dtype=float), "rss": pd.Series(dtype=float)}
    by_run = mine.groupby("run_id")
    return {"allocated": by_run["allocated_peak"].max(), "rss": by_run["rss_peak"].max()}


VARIANT_COLUMNS = ("variant", "is_control", "planned", *COUNTED, "other", "withdrawn",
                   "relaunches", "n", "mean", "std", "min", "max", "values", "missing")


def _variant_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per variant, over its original planned runs (one per seed); withdrawn and relaunched
    runs are counted apart and never in the statistics."""
    rows = []
    for variant, group in runs.groupby("variant", sort=False):
        originals = group[group["original"]]
        withdrawn = originals[originals["status"] == "withdrawn"]
        planned = originals[originals["status"] != "withdrawn"].sort_values("seed")
        valued = planned[planned["status"].isin(VALUED) & planned["final_metric"].notna()
                         & _within_budget(planned)]
        numbers = valued["final_metric"].astype(float)
        valued_ids = set(valued["run_id"].tolist())
        counts = {status: int((planned["status"] == status).sum()) for status in COUNTED}
        rows.append({
            "variant": variant,
            "is_control": bool(group["is_control"].iloc[0]),
            "planned": len(planned),
            **counts,
            "other": len(planned) - sum(counts.values()),
            "withdrawn": len(withdrawn),
            "relaunches": int((~group["original"]).sum()),
            "n": len(numbers),
            "mean": float(numbers.mean()) if len(numbers) else None,
            "std": float(numbers.std(ddof=1)) if len(numbers) > 1 else None,
            "min": float(numbers.min()) if len(numbers) else None,
            "max": float(numbers.max()) if len(numbers) else None,
            "values": {str(int(s)): float(v) for s, v in zip(valued["seed"], numbers, strict=True)},
            "missing": {str(int(r.seed)): _without_value(r) for r in planned.itertuples()
                        if r.run_id not in valued_ids},
        })
    return pd.DataFrame(rows, columns=list(VARIANT_COLUMNS))


def _within_budget(runs: pd.DataFrame) -> pd.Series:
    """Runs whose updates stayed within the budget (a value past it is not counted)."""
    return ~((runs["updates_planned"] > 0) & (runs["updates_done"] > runs["updates_planned"]))


def _without_value(run: Any) -> str:
    """Why a planned seed has no value, in words."""
    if run.status == "planned":
        return "planned: not run yet"
    if exceeds_budget(run):
        return (f"{run.status}: {run.updates_done} of {run.updates_planned} updates "
                "(budget exceeded)")
    words = stop_words(run)
    return f"{run.status}: {words}" if words else str(run.status)


def _deltas(originals: pd.DataFrame) -> pd.DataFrame:
    """Each variant's final metric minus the control's, seed by seed, original runs only (a
    relaunch answers for itself in the relaunch table); a seed without a value has no delta."""
    valued = originals[originals["status"].isin(VALUED) & _within_budget(originals)]
    control = valued[valued["is_control"]].set_index("seed")["final_metric"]
    mine = valued.set_index("run_id")["final_metric"]
    rows = []
    for r in originals[~originals["is_control"]].itertuples():
        value, base = mine.get(r.run_id), control.get(r.seed)
        value = None if value is None or pd.isna(value) else float(value)
        base = None if base is None or pd.isna(base) else float(base)
        delta = value - base if value is not None and base is not None else None
        rows.append({"variant": r.variant, "seed": int(r.seed), "run_id": r.run_id,
                     "metric": value, "control": base, "delta": delta})
    return pd.DataFrame(rows, columns=["variant", "seed", "run_id", "metric", "control", "delta"])


def _pilot_phases(pilots: pd.DataFrame, phases: pd.DataFrame) -> pd.DataFrame:
    """Each gate class's latest pilot, one row per phase (what each phase cost before launch,
    and the overfit criterion it was held to); one table, a ``gate_class`` column first."""
    columns = ["gate_class", "pilot_id", "phase", "device", "duration_s", "allocated_peak",
               "baseline_allocated", "reserved_peak", "rss", "rss_peak", "verdict",
               "detail"]
    if pilots.empty or phases.empty:
        return pd.DataFrame(columns=columns)
    classes = pilots["gate_class"] if "gate_class" in pilots else pd.Series(
        [None] * len(pilots), index=pilots.index)
    latest = pilots.assign(gate_class=classes.fillna("(whole spec)")).groupby(
        "gate_class", sort=False)["pilot_id"].max()
    chosen = phases[phases["pilot_id"].isin(latest.to_numpy())]
    owner = {int(p): c for c, p in latest.items()}
    table = chosen.assign(gate_class=chosen["pilot_id"].map(lambda p: owner[int(p)]),
                          pilot_id=chosen["pilot_id"].astype(int))
    return table[columns].reset_index(drop=True)
