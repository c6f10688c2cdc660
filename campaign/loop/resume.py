"""Resuming a run: which checkpoint it continues from, and the check of the steps it replays.

Resume never destroys (docs/processes.md): the checkpoint is chosen and verified
*before* the run leaves ``interrupted``/``lost``. Newest first, each recorded
checkpoint is found (its recorded path, else under the ``--artifacts`` folder
it moved to), its SHA-256 compared with the ledger's and its header read as
safetensors (never unpickled); the first that holds is the one, and the newer
ones skipped are named with why. When every recorded checkpoint fails,
:class:`~campaign.loop.checkpoint.CheckpointError` is raised and nothing has
changed. A resumed segment re-executes the updates after its checkpoint; the
ledger keeps both values of every replayed step, and comparing them is a free
determinism check recorded as an event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from campaign.errors import CheckpointError
from campaign.ledger import Ledger
from campaign.loop.checkpoint_file import FORMAT_VERSION, STATE_KEY, file_sha256, shard_problem
from campaign.loop.run_files import locate
from campaign.stack.provenance import unread_problem


@dataclass
class ResumePoint:
    """The checkpoint a resume continues from (None: from the start, none was ever written)."""

    checkpoint: dict[str, Any] | None
    skipped: list[str] = field(default_factory=list)

    def event_detail(self) -> str | None:
        """What a ``resume`` event says when newer checkpoints were passed over."""
        if not self.skipped:
            return None
        chosen = self.checkpoint
        where = f"checkpoint {chosen['path']} (step {chosen['step']})" if chosen else "the start"
        return f"resumed from {where}; newer ones skipped: " + "; ".join(self.skipped)


def checkpoint_rows(ledger: Ledger, campaign: str, run_id: str) -> list[dict[str, Any]]:
    """The run's checkpoint rows, newest first (id, path, sha256, step)."""
    frame = ledger.artifacts(campaign)
    mine = frame[(frame["run_id"] == run_id) & (frame["kind"] == "checkpoint")]
    rows = mine.sort_values(["step", "id"], ascending=False)
    return [{"id": int(r["id"]), "path": str(r["path"]), "sha256": str(r["sha256"]),
             "step": int(r["step"]), "bytes": None if r["bytes"] != r["bytes"] else int(r["bytes"])}
            for _, r in rows.iterrows()]


def choose_resume_point(
    ledger: Ledger, campaign: str, run_id: str, config_sha256: str, artifacts: Path
) -> ResumePoint:
    """The newest checkpoint that verifies; :class:`CheckpointError` when some were recorded
    and none does (the run stays as it is)."""
    rows = checkpoint_rows(ledger, campaign, run_id)
    skipped: list[str] = []
    for row in rows:
        path = locate(row["path"], artifacts, run_id)
        problem = _problem(path, row["sha256"], row["bytes"], config_sha256)
        if problem is None:
            return ResumePoint({**row, "path": str(path)}, skipped)
        skipped.append(f"{row['path']} (step {row['step']}): {problem}")
    if rows:
        raise CheckpointError(
            f"run {run_id}: none of its {len(rows)} checkpoints verifies, nothing was changed "
            f"(the run stays resumable): {'; '.join(skipped[:3])}"
            + (f"; and {len(skipped) - 3} more" if len(skipped) > 3 else "")
        )
    return ResumePoint(None)


def _problem(path: Path, sha256: str, size: int | None, config_sha256: str) -> str | None:
    if not path.exists():
        return "the file is missing (moved, deleted or pruned; try --artifacts DIR)"
    unread = unread_problem(path, size)
    if unread is not None:
        return f"it {unread}: refused unread"
    actual = file_sha256(path)
    if actual != sha256:
        return f"sha256 {actual[:12]} differs from the recorded {sha256[:12]}"
    try:
        with safe_open(str(path), framework="numpy") as handle:
            state = json.loads((handle.metadata() or {})[STATE_KEY])
    except (SafetensorError, ValueError, KeyError, OSError) as error:
        return f"not a readable campaign checkpoint ({error})"
    if state.get("format") != FORMAT_VERSION:
        return f"unknown checkpoint format {state.get('format')!r}"
    if state.get("config_sha256") != config_sha256:
        return "it belongs to another config"
    return shard_problem(path, state)


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
