"""What a launch leaves behind when it ends unfinished, and the one command that continues it.

After a fault (a signal, a killed worker, a run's process killed, a full volume) the last
lines a user reads must say which runs are not done, where each stands (status, stop cause,
update, last checkpoint) and how to go on, planned runs that never started included: "2
lost" alone sends them to the ledger. Read from the ledger only, after the workers ended.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from campaign.ledger import Ledger

RESUMABLE = ("interrupted", "lost")
LISTED_AT_MOST = 20  # one line each; the rest are counted


def left_behind(ledger: Ledger, campaign: str, given: Sequence[str] = ()) -> list[str]:
    """One line per run not done (interrupted, lost, still running, never started), then the
    command that continues them (with ``given``: the options the launch was given, where it
    ran and on what); empty when every run has ended. A run relaunched under a new id is
    done with: its relaunch is the one listed."""
    runs = ledger.runs(campaign)
    relaunched = set(runs["relaunch_of"].dropna())
    waiting = runs[runs["status"].isin((*RESUMABLE, "running")) & ~runs["run_id"].isin(relaunched)]
    planned = int((runs["status"] == "planned").sum())
    if waiting.empty and not planned:
        return []
    checkpoints = _last_checkpoints(ledger, campaign)
    lines = [_line(row, checkpoints.get(row.run_id)) for row in waiting.itertuples()]
    if len(lines) > LISTED_AT_MOST:
        lines = [*lines[:LISTED_AT_MOST], f"... and {len(lines) - LISTED_AT_MOST} more"]
    if planned:
        lines.append(f"{planned} planned run{'s' * (planned > 1)} never started")
    return [*lines, continue_command(campaign, set(waiting["status"]), given)]


def continue_command(campaign: str, statuses: set[str], given: Sequence[str] = ()) -> str:
    """The command that continues the campaign: planned runs always, the resumable ones only
    when asked for by name. A run left ``running`` with no worker is declared lost once its
    lease runs out, and resumed then with ``--resume-lost``."""
    flags = [f"--resume-{s}" for s in RESUMABLE if s in statuses]
    if "running" in statuses and "--resume-lost" not in flags:
        flags.append("--resume-lost")
    return "continue with: " + " ".join(["campaign launch", campaign, *given, *flags])


def _line(row: Any, checkpoint: int | None) -> str:
    step = row.stop_step
    where = f" at update {int(step)}" if step is not None and step == step else ""
    cause = f" ({row.stop_cause})" if isinstance(row.stop_cause, str) else ""
    saved = (f", last checkpoint at update {checkpoint}" if checkpoint is not None
             else ", no checkpoint yet")
    status = row.status if row.status != "running" else "running with no worker left"
    return f"run {row.run_id} ({row.variant}, seed {int(row.seed)}): {status}{cause}{where}{saved}"


def _last_checkpoints(ledger: Ledger, campaign: str) -> dict[str, int]:
    artifacts = ledger.artifacts(campaign)
    saved = artifacts[artifacts["kind"] == "checkpoint"]
    return {str(k): int(v) for k, v in saved.groupby("run_id")["step"].max().items()}
