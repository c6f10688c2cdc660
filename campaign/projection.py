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
               + fixed_s)  # fmt: skip
    compute = runs * per_run
    reserved = compute * reserve
    total = compute + reserved
    fits = next((days for days in RENTAL_DAYS if total <= days * 86400), None)
    return Projection(per_run, compute, reserved, total, fits)


def counts(config: Mapping[str, Any]) -> dict[str, int]:
    """Updates, validation points and checkpoints of one run of ``config``."""
    updates = int(config["budget"]["updates"])
    every = int(config["validation"]["every"])
    validations = updates // every + (0 if updates % every == 0 else 1)  # always a last one
    checkpoint_every = config["loop"].get("checkpoint_every") or every
    checkpoints = updates // int(checkpoint_every) + 1  # and one at the stop
    return {"updates": updates, "validations": validations, "checkpoints": checkpoints}
