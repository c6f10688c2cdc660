"""The sizing sheet: from the pilot's measurements to memory per device and a rental that fits.

The projection's arithmetic lives in :mod:`campaign.projection` (the report
projects planned runs with it too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from campaign.projection import Projection, counts, project

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
    """What ``campaign size`` shows: a header (campaign, counts, settings, projection), the
    pilot's phase table, and a warning when the pilot ran on another device type."""

    header: dict[str, Any]
    phases: list[dict[str, Any]]
    warning: str | None

    def document(self) -> dict[str, Any]:
        return {**self.header, "phases": self.phases}


def sizing_sheet(
    ledger: LedgerReader, campaign: str, *, target: str | None = None, reserve: float = 0.2
) -> SizingSheet:
    """The sizing sheet of ``campaign`` from its latest pilot's measurements."""
    from campaign.ledger.errors import LedgerInputError

    phases = ledger.phases(campaign)
    runs = ledger.runs(campaign)
    pilots = ledger.pilots(campaign)
    phases = phases[phases["pilot_id"].notna()]
    if phases.empty:
        raise LedgerInputError(f"campaign {campaign!r} has no pilot yet: run `campaign pilot`")
    latest = phases[phases["pilot_id"] == phases["pilot_id"].max()]
    duration = dict(zip(latest["phase"], latest["duration_s"], strict=False))
    config = runs.iloc[0]["config"]
    count = counts(config)
    projection = project(
        update_s=float(duration["update"]),
        validation_s=float(duration["validation"]),
        checkpoint_s=float(duration["checkpoint"]),
        runs=len(runs),
        reserve=reserve,
        **count,
    )
    loop = config["loop"]
    pilot_device = str(latest["device"].iloc[0])
    stack = (None if pilots.empty else pilots["environment"].iloc[-1]) or {}
    header = {
        "campaign": campaign,
        "runs": len(runs),
        **count,
        "precision": loop["precision"],
        "microbatch": loop["microbatch"],
        "accumulation": loop["accumulation"],
        "strategy": f"data replicas x{loop['replicas']}",
        "pilot_device": pilot_device,
        "devices": ", ".join(stack.get("devices", [])),
        "torch": stack.get("torch"),
        **projection.as_dict(),
    }
    warning = None
    if target is not None and target.split(":")[0] != pilot_device.split(":")[0]:
        warning = (
            f"the pilot ran on {pilot_device}, this sheet is for {target}: its times and "
            "memory are not measurements of that device"
        )
        header["warning"] = warning
    return SizingSheet(header, phase_table(latest), warning)
