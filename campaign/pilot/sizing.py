"""The sizing sheet: from each gate class's pilot to time, rentals and memory that fit.

Per gate class (campaign/gates/classes.py), from its latest passing pilot:
the median update, validation and checkpoint times and the per-run fixed
costs the pilot measured (building the task and the model; export with its
fresh-process replay), with how far apart its timed updates were (a spread over
2x is a warning: the pilot ran on a busy machine). The runs still to run are
ordered by priority (seed by seed, the control first, then the variants in spec order,
relaunches last) and the sheet says how many fit in a 3-, 7- and 30-day rental. With a
card's memory it checks each class's measured CUDA peaks (allocated and
reserved, per device, never added) against it. The projection's arithmetic
lives in :mod:`campaign.plan.time_projection` (the report projects planned runs too).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from campaign.gates.classes import EXECUTABLE, gate_class
from campaign.gates.rule import gate_state, pilot_decisions
from campaign.pilot.strategies import ASSUMPTIONS, smallest_rentals, strategy_rows
from campaign.plan.time_projection import (
    RENTAL_DAYS,
    Projection,
    counts,
    latest_passing_pilot,
    pilot_figures,
    project,
)

if TYPE_CHECKING:
    from campaign.ledger.reads import LedgerReader

__all__ = ["Projection", "SizingSheet", "counts", "phase_table", "project", "sizing_sheet"]

def phase_table(phases: pd.DataFrame) -> list[dict[str, Any]]:
    """Per phase and device: duration and memory peaks (allocated and reserved apart)."""
    rows = []
    for item in phases.itertuples():
        rows.append(
            {
                "phase": item.phase,
                "device": item.device,
                "verdict": item.verdict,
                "duration_s": None
                if pd.isna(item.duration_s)
                else round(float(item.duration_s), 4),
                "allocated_peak": _int(item.allocated_peak),
                "reserved_peak": _int(item.reserved_peak),
                "rss_peak": _int(item.rss_peak),
                "longest": (item.inputs or {}).get("longest")
                if isinstance(item.inputs, dict)
                else None,
            }
        )
    return rows


def _int(value: Any) -> int | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else int(value)


@dataclass(frozen=True)
class SizingSheet:
    """What ``campaign size`` shows: a header (campaign, totals), one line per gate class
    (its pilot's times, per-run seconds, memory against the card), the rental packages, the
    pilots' phase tables, and a warning when a pilot is missing or ran on another device."""

    header: dict[str, Any]
    phases: list[dict[str, Any]]
    warning: str | None

    classes: list[dict[str, Any]]
    packages: list[dict[str, Any]]
    strategies: list[dict[str, Any]] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        return {**self.header, "classes": self.classes, "packages": self.packages,
                "phases": self.phases, "strategies": self.strategies,
                "strategy_assumptions": ASSUMPTIONS}


UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
         "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_memory(text: str) -> int:
    """``80GiB``, ``80 GB``, ``81920MiB`` -> bytes; ValueError naming the input otherwise."""
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not found or found.group(2).lower() not in UNITS:
        raise ValueError(f"{text!r} is not a memory size (e.g. 80GiB, 24GB, 81920MiB)")
    return int(float(found.group(1)) * UNITS[found.group(2).lower()])


def sizing_sheet(
    ledger: LedgerReader,
    campaign: str,
    *,
    target: str | None = None,
    reserve: float = 0.2,
    gpu_memory: int | None = None,
    headroom: float = 0.1,
) -> SizingSheet:
    """The sizing sheet of ``campaign`` from each gate class's latest passing pilot."""
    from campaign.errors import LedgerInputError

    record = ledger.campaign(campaign)
    runs = ledger.runs(campaign)
    pilots, phases = ledger.pilots(campaign), ledger.phases(campaign)
    events = ledger.events(campaign)
    if phases.empty or phases["pilot_id"].isna().all():
        raise LedgerInputError(f"campaign {campaign!r} has no pilot yet: run `campaign pilot`")
    todo = runs[runs["status"].isin(EXECUTABLE)]
    sizing_done = todo.empty  # everything ran: size the whole plan (to compare with the runs)
    chosen = runs[runs["status"] != "withdrawn"] if sizing_done else todo
    ordered = _by_priority(chosen)
    lines, per_run, tables, warnings, strategies = [], {}, [], [], []
    for class_id, members in ordered.groupby(ordered["config"].map(lambda c: gate_class(c).id),
                                             sort=False):
        line, table, seconds = _class_line(class_id, members, pilots, phases, events,
                                           record.spec_sha256, gpu_memory)
        rows = _strategies(line, phases, members["config"].iloc[0], headroom, gpu_memory)
        line.update({f"rental_{k}": v for k, v in smallest_rentals(rows).items()} if rows else {})
        strategies += rows
        lines.append(line)
        tables += table
        per_run.update(seconds)
        if line.get("pilot_id") is None:
            warnings.append(f"gate class {class_id} ({len(members)} runs) has no passing "
                            f"pilot: its runs are not projected (`campaign pilot {campaign}`)")
            continue
        if _noisy(line):
            warnings.append(f"gate class {class_id}: the pilot's {line['update_repetitions']} "
                            f"timed updates took {line['update_range_s'][0]:g} to "
                            f"{line['update_range_s'][1]:g} s ({line['update_spread']:g}x apart: "
                            "the machine was busy); the projection takes their median, and "
                            "a pilot on a quiet machine measures it better")
        if target is not None and target.split(":")[0] != line["device"].split(":")[0]:
            warnings.append(f"the pilot ran on {line['device']}, this sheet is for {target}: its "
                            "times and memory are not measurements of that device")
    projected = [per_run[r] for r in ordered["run_id"] if r in per_run]
    compute = sum(projected)
    total = compute * (1 + reserve)
    packages = _packages(ordered, per_run, reserve)
    header = {
        "campaign": campaign,
        "runs": len(ordered),
        "sized": "every run of the plan (none left to run)" if sizing_done else "runs left to run",
        "gate_classes": len(lines),
        "reserve": reserve,
        "compute_hours": round(compute / 3600, 4),
        "total_hours": round(total / 3600, 4),
        "seconds_per_run": round(compute / len(projected), 3) if projected else None,
        "fits_rental_days": next((d for d in RENTAL_DAYS if total <= d * 86400), None),
    }
    if warnings:
        header["warning"] = "; ".join(warnings)
    return SizingSheet(header, tables, "; ".join(warnings) or None, lines, packages, strategies)


def _strategies(line: dict[str, Any], phases: pd.DataFrame, config: dict[str, Any],
                headroom: float, card: int | None) -> list[dict[str, Any]]:
    """The class's memory per device under each strategy and W (pilot/strategies.py), from
    its pilot's state facts and forward activations (none from a pilot before them)."""
    rows = phases[phases["pilot_id"] == line.get("pilot_id")]
    first = rows[rows["phase"] == "update_first"]["inputs"]
    forward = rows[rows["phase"] == "forward"]["inputs"]
    facts = (first.iloc[0] or {}).get("state") if len(first) else None
    saved = ((forward.iloc[0] or {}).get("activations") or {}) if len(forward) else {}
    if not facts:
        return []
    loop = config["loop"]
    line["strategy"] = loop.get("strategy", "replicate")
    return [{"gate_class": line["gate_class"], **row} for row in strategy_rows(
        facts, int(saved.get("saved_bytes") or 0), loop, line.get("update_s"), headroom, card)]


def _by_priority(runs: pd.DataFrame) -> pd.DataFrame:
    """Seed by seed, the control first, then the variants in plan order; relaunches last."""
    variants = list(dict.fromkeys(runs.sort_values("created_at")["variant"]))
    controls = set(runs[runs["is_control"]]["variant"])
    rank = {v: (v not in controls, i) for i, v in enumerate(variants)}
    seeds = {s: i for i, s in enumerate(sorted(set(runs["seed"])))}
    keys = [(r.relaunch_of is not None and not pd.isna(r.relaunch_of), seeds[r.seed],
             rank[r.variant], r.created_at) for r in runs.itertuples()]
    order = sorted(range(len(runs)), key=lambda i: keys[i])
    return runs.iloc[order]


def _class_line(class_id: str, members: pd.DataFrame, pilots: pd.DataFrame,
                phases: pd.DataFrame, events: pd.DataFrame, spec_sha256: str,
                gpu_memory: int | None) -> tuple[dict[str, Any], list[dict[str, Any]],
                                                 dict[str, float]]:
    decided = pilot_decisions(pilots, events, spec_sha256, class_id)
    line: dict[str, Any] = {"gate_class": class_id, "runs": len(members),
                            "variants": ", ".join(dict.fromkeys(members["variant"]))}
    pilot_id = latest_passing_pilot(pilots, spec_sha256, class_id)
    rows = phases[phases["pilot_id"] == pilot_id]
    figures = pilot_figures(rows) if pilot_id is not None and len(rows) else None
    if gate_state(decided, []).how != "pass" or figures is None:
        return {**line, "pilot_id": None}, [], {}
    seconds = {run_id: project(runs=1, **figures, **counts(config)).seconds_per_run
               for run_id, config in zip(members["run_id"], members["config"], strict=True)}
    line.update({
        "pilot_id": pilot_id, "device": str(rows["device"].iloc[0]),
        "update_s": round(figures["update_s"], 6),
        "validation_s": round(figures["validation_s"], 6),
        "checkpoint_s": round(figures["checkpoint_s"], 6),
        "fixed_s": round(figures["fixed_s"], 3),
        **_update_noise(rows),
        "seconds_per_run": round(sum(seconds.values()) / len(seconds), 3),
        **_memory(rows, gpu_memory),
    })
    return line, [{"gate_class": class_id, **r} for r in phase_table(rows)], seconds


NOISY = 2.0  # the slowest of the pilot's timed updates this many times its fastest: said,
NOISY_S = 0.05  # once they are this far apart (a millisecond update's jitter projects nothing)


def _noisy(line: dict[str, Any]) -> bool:
    low, high = line.get("update_range_s") or (0.0, 0.0)
    return (line.get("update_spread") or 0) > NOISY and high - low >= NOISY_S


def _update_noise(rows: pd.DataFrame) -> dict[str, Any]:
    """How far apart the pilot's timed updates were (its median is the projection's update
    time): the repetitions, their range and the slowest over the fastest. A pilot measured
    at load once projected ten times the run's real time, with nothing to say so."""
    update = rows[rows["phase"] == "update"]
    inputs = update["inputs"].iloc[0] if len(update) else None
    spread = (inputs or {}).get("range_s") if isinstance(inputs, dict) else None
    if not isinstance(spread, list) or len(spread) != 2 or not spread[0] > 0:
        return {}
    return {"update_repetitions": int(inputs.get("repetitions") or 0),
            "update_range_s": [float(spread[0]), float(spread[1])],
            "update_spread": round(float(spread[1]) / float(spread[0]), 2)}


def _memory(rows: pd.DataFrame, gpu_memory: int | None) -> dict[str, Any]:
    """The class's peaks per device (allocated and reserved apart) and, with a card, whether
    the reserved peak fits with its headroom."""
    cuda = rows[rows["allocated_peak"].notna()]
    if cuda.empty:
        found: dict[str, Any] = {"allocated_peak": None, "reserved_peak": None}
        if gpu_memory is not None:
            found["fits_card"] = None
            found["memory_note"] = "no CUDA measurement: pilot this class on the GPU"
        return found
    worst = cuda.groupby("device")[["allocated_peak", "reserved_peak"]].max()
    allocated, reserved = int(worst["allocated_peak"].max()), int(worst["reserved_peak"].max())
    found = {"allocated_peak": allocated, "reserved_peak": reserved}
    if gpu_memory is not None:
        found["fits_card"] = reserved <= gpu_memory
        found["headroom_bytes"] = gpu_memory - reserved
        found["headroom_fraction"] = round((gpu_memory - reserved) / gpu_memory, 3)
    return found


def _packages(ordered: pd.DataFrame, per_run: dict[str, float],
              reserve: float) -> list[dict[str, Any]]:
    """For each rental period: how many runs, in priority order, its time holds."""
    packages = []
    for days in RENTAL_DAYS:
        budget, used, fitted, last = days * 86400, 0.0, 0, None
        for run_id, variant, seed in zip(ordered["run_id"], ordered["variant"],
                                         ordered["seed"], strict=True):
            seconds = per_run.get(run_id)
            if seconds is None or used + seconds * (1 + reserve) > budget:
                break
            used += seconds * (1 + reserve)
            fitted, last = fitted + 1, f"{variant} seed {seed}"
        packages.append({"days": days, "runs_that_fit": fitted, "of": len(ordered),
                         "all_fit": fitted == len(ordered), "last_run": last,
                         "hours_used": round(used / 3600, 3)})
    return packages
