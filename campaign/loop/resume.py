"""Resuming a run: which checkpoint it continues from, and the check of the steps it replays.

A resumed segment re-executes the updates after its checkpoint; the ledger
keeps both values of every replayed step, and comparing them is a free
determinism check recorded as an event.
"""

from __future__ import annotations

from typing import Any

from campaign.ledger import Ledger


def latest_checkpoint(ledger: Ledger, campaign: str, run_id: str) -> dict[str, Any] | None:
    """The run's newest checkpoint row (id, path, sha256, step), or None."""
    frame = ledger.artifacts(campaign)
    mine = frame[(frame["run_id"] == run_id) & (frame["kind"] == "checkpoint")]
    if mine.empty:
        return None
    row = mine.sort_values(["step", "id"]).iloc[-1]
    return {
        "id": int(row["id"]),
        "path": row["path"],
        "sha256": row["sha256"],
        "step": int(row["step"]),
    }


def replayed_steps_report(ledger: Ledger, run_id: str, segment_id: int) -> str | None:
    """Compare the train/loss of steps this segment re-executed with the values first logged."""
    frame = ledger.metrics(runs=[run_id], keys=["train/loss"], all_segments=True)
    mine = frame[frame["segment_id"] == segment_id].set_index("step")["value"]
    earlier = frame[frame["segment_id"] != segment_id]
    earlier = earlier[earlier["step"].isin(mine.index)].groupby("step")["value"].last()
    if earlier.empty:
        return None
    difference = float((mine.loc[earlier.index] - earlier).abs().max())
    return (
        f"{len(earlier)} replayed steps ({int(earlier.index.min())}-{int(earlier.index.max())}): "
        f"max |train/loss difference| = {difference:.3g}"
        + (" (identical)" if difference == 0 else "")
    )
