"""Where a campaign stands, read from the ledger alone: the same view for `launch`, `status`
and the dashboard.

Anyone with the ledger URL sees it from any machine; nothing is kept in the
launcher's memory. Runs done / running / left, each running run's update
counter and heartbeat age, and an ETA from the update rate of the runs that
ended so far.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from campaign.ledger.vocabulary import (
    ENDED_STATUSES,
    RUN_STATUSES,
    TERMINAL_STATUSES,
    paused_at_rung,
)

if TYPE_CHECKING:
    from campaign.ledger.store import Ledger


@dataclass(frozen=True)
class RunningRun:
    run_id: str
    variant: str
    seed: int
    worker: str | None
    step: int
    updates: int
    heartbeat_age_s: float | None


@dataclass(frozen=True)
class Snapshot:
    campaign: str
    counts: Mapping[str, int]
    running: tuple[RunningRun, ...] = ()
    eta_s: float | None = None
    updates_per_s: float | None = None
    at: float = field(default_factory=time.time)
    paused: int = 0  # interrupted runs paused at a search's rung: its decision moves them

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def done(self) -> int:
        return sum(self.counts.get(s, 0) for s in TERMINAL_STATUSES)

    @property
    def left(self) -> int:
        """Planned runs and those waiting to be resumed: both still have work to do."""
        return self.counts.get("planned", 0) + self.resumable + self.paused

    @property
    def resumable(self) -> int:
        return self.counts.get("interrupted", 0) + self.counts.get("lost", 0) - self.paused

    def document(self) -> dict[str, Any]:
        return {
            "campaign": self.campaign,
            "counts": dict(self.counts),
            "total": self.total,
            "done": self.done,
            "running": [asdict(r) for r in self.running],
            "left": self.left,
            "resumable": self.resumable,
            "paused": self.paused,
            "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
            "updates_per_s": self.updates_per_s,
        }

    def summary(self) -> str:
        """Done / running / left, with the end states counted."""
        ended = ", ".join(
            f"{s} {self.counts[s]}" for s in RUN_STATUSES
            if s in ENDED_STATUSES | TERMINAL_STATUSES and self.counts[s]
        )
        done = f"{self.campaign}: {self.done}/{self.total} done" + (f" ({ended})" if ended else "")
        waiting = ", ".join(([f"{self.resumable} to resume"] if self.resumable else [])
                            + ([f"{self.paused} paused at a rung"] if self.paused else []))
        waiting = f" ({waiting})" if waiting else ""
        return f"{done}, {len(self.running)} running, {self.left} left{waiting}"

    def line(self) -> str:
        """One plain line (for pipes and CI logs): the summary, update counters and ETA."""
        parts = [self.summary()]
        if self.running:
            parts.append(
                "updates " + " ".join(f"{r.run_id[-6:]}:{r.step}/{r.updates}" for r in self.running)
            )
        parts.append(f"ETA {format_duration(self.eta_s)}")
        return ", ".join(parts)


def take_snapshot(ledger: Ledger, campaign: str, workers: int | None = None) -> Snapshot:
    """Read the campaign's state from the ledger: two cheap queries, no DataFrame (a launcher
    polls this every second)."""
    now, rows = ledger.progress_rows(campaign)
    for row in rows:
        row["updates"] = int(json.loads(row["config"])["budget"]["updates"] or 0)
    active = [row["id"] for row in rows if row["status"] == "running"]
    return snapshot_of(campaign, now, rows, ledger.latest_steps(active), workers)


def snapshot_of(
    campaign: str,
    now: datetime,
    rows: list[dict[str, Any]],
    steps: Mapping[str, int],
    workers: int | None = None,
) -> Snapshot:
    """The snapshot of runs already read: each row has id, variant, seed, status, worker,
    stop_step, started_at, ended_at, heartbeat_at and ``updates`` (planned); ``steps`` the
    latest update of each running run. Shared by the launcher and the dashboard."""
    counts = dict.fromkeys(RUN_STATUSES, 0)
    for row in rows:
        counts[row["status"]] += 1
    running = tuple(
        RunningRun(
            run_id=row["id"],
            variant=row["variant"],
            seed=int(row["seed"]),
            worker=row["worker"],
            step=steps.get(row["id"], 0),
            updates=row["updates"],
            heartbeat_age_s=_age(now, row["heartbeat_at"]),
        )
        for row in rows
        if row["status"] == "running"
    )
    rate = _updates_per_second(rows)
    remaining = sum(r["updates"] for r in rows if r["status"] == "planned") + sum(
        max(0, r.updates - r.step) for r in running
    ) + sum(max(0, r["updates"] - int(r["stop_step"] or 0))  # a resume goes on from its stop
            for r in rows if r["status"] in ("interrupted", "lost"))
    parallel = max(1, workers or len(running) or 1)
    eta = None if rate is None else remaining / (rate * parallel)
    paused = sum(paused_at_rung(r["status"], r.get("stop_detail")) for r in rows)
    return Snapshot(campaign, counts, running, eta, rate, paused=paused)


def _updates_per_second(rows: list[dict[str, Any]]) -> float | None:
    """Updates per second of one worker, from the runs that ended (their stop step and the
    time from start to end)."""
    steps, seconds = 0.0, 0.0
    for row in rows:
        if row["status"] in TERMINAL_STATUSES and row["started_at"] and row["ended_at"]:
            steps += row["stop_step"] or 0
            seconds += (row["ended_at"] - row["started_at"]).total_seconds()
    return steps / seconds if seconds > 0 and steps > 0 else None


def _age(now: datetime, moment: datetime | None) -> float | None:
    if moment is None:
        return None
    return round((now - moment).total_seconds(), 1)


def format_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "unknown"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
