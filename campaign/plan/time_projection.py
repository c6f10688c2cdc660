"""Projected time of runs from a pilot's measured phase times: plain arithmetic, one pure
function, checkable by hand.

Every run does ``updates`` updates, ``validations`` validations and
``checkpoints`` checkpoints at the pilot's measured times; the
evaluation/export reserve is added on top; the smallest rental period (3, 7
or 30 days) that holds the total is the one that fits. The sizing sheet and
the report's projected time of planned runs both use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from campaign.loop.stop import validates_after

RENTAL_DAYS = (3, 7, 30)


@dataclass(frozen=True)
class Projection:
    seconds_per_run: float
    compute_seconds: float
    reserve_seconds: float
    total_seconds: float
    fits: int | None  # days of the smallest rental period that holds it, None if none

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds_per_run": round(self.seconds_per_run, 3),
            "compute_hours": round(self.compute_seconds / 3600, 3),
            "reserve_hours": round(self.reserve_seconds / 3600, 3),
            "total_hours": round(self.total_seconds / 3600, 3),
            "fits_rental_days": self.fits,
        }


def project(
    *,
    update_s: float,
    validation_s: float,
    checkpoint_s: float,
    runs: int,
    updates: int,
    validations: int,
    checkpoints: int,
    reserve: float = 0.2,
    fixed_s: float = 0.0,
) -> Projection:
    """runs x (updates x t_update + validations x t_validation + checkpoints x t_checkpoint
    + the per-run fixed costs: building the task and model, export and replay), plus
    ``reserve`` (a fraction) for evaluation and export."""
    per_run = (updates * update_s + validations * validation_s + checkpoints * checkpoint_s
               + fixed_s)
    compute = runs * per_run
    reserved = compute * reserve
    total = compute + reserved
    fits = next((days for days in RENTAL_DAYS if total <= days * 86400), None)
    return Projection(per_run, compute, reserved, total, fits)


def counts(config: Mapping[str, Any]) -> dict[str, int]:
    """Updates, validation points and checkpoints of one run of ``config``."""
    updates = int(config["budget"]["updates"])
    every = int(config["validation"]["every"])
    offset = int(config["validation"].get("offset") or 0)
    at = updates // every if not offset else (updates - offset) // every + 1
    validations = at + (0 if validates_after(updates, config["validation"]) else 1)  # a last
    checkpoint_every = config["loop"].get("checkpoint_every") or every
    checkpoints = updates // int(checkpoint_every) + 1  # and one at the stop
    return {"updates": updates, "validations": validations, "checkpoints": checkpoints}


def pilot_figures(rows: Any) -> dict[str, float] | None:
    """The figures a projection takes from one pilot's phase rows (a frame with ``phase``,
    ``duration_s`` and ``inputs``): the update, validation and checkpoint times and the per-run
    fixed costs (building the task and model, export with its replay); None when a phase the
    projection needs is missing. A replicated class's update is its slowest rank's."""
    duration = dict(zip(rows["phase"], rows["duration_s"], strict=False))
    inputs = dict(zip(rows["phase"], rows["inputs"], strict=False))
    if not {"update", "validation", "checkpoint"} <= duration.keys():
        return None
    setup = float((inputs.get("data") or {}).get("setup_s") or 0.0)
    # A replicated class: its ranks take their shares at once, the group as fast as its
    # slowest rank (the single-process row took the whole effective batch alone).
    ranks = rows[rows["phase"] == "replicas"]["duration_s"].dropna()
    update = float(ranks.max()) if len(ranks) else float(duration["update"])
    return {"update_s": update, "validation_s": float(duration["validation"]),
            "checkpoint_s": float(duration["checkpoint"]),
            "fixed_s": setup + float(duration.get("export") or 0.0)}


def latest_passing_pilot(pilots: Any, spec_sha256: str, gate_class: str) -> int | None:
    """The id of the latest passing pilot of the frozen spec that speaks for ``gate_class``
    (its own, or one recorded before pilots had classes)."""
    passing = pilots[(pilots["config_sha256"] == spec_sha256) & (pilots["verdict"] == "pass")]
    if "gate_class" in passing:
        passing = passing[passing["gate_class"].isna() | (passing["gate_class"] == gate_class)]
    return int(passing["pilot_id"].iloc[-1]) if len(passing) else None
