"""Where a campaign stands, read from the ledger alone: the same view for `launch` and `status`.

Anyone with the ledger URL sees it from any machine; nothing is kept in the
launcher's memory. Runs done / running / left, each running run's update
counter and heartbeat age, and an ETA from the update rate of the runs that
ended so far.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import pandas as pd

from campaign.ledger import Ledger
from campaign.ledger.vocabulary import ENDED_STATUSES, RUN_STATUSES, TERMINAL_STATUSES


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

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def done(self) -> int:
        return sum(self.counts.get(s, 0) for s in TERMINAL_STATUSES)

    @property
    def left(self) -> int:
        return self.counts.get("planned", 0)

    @property
    def resumable(self) -> int:
        return self.counts.get("interrupted", 0) + self.counts.get("lost", 0)

    def document(self) -> dict[str, Any]:
        return {
            "campaign": self.campaign,
            "counts": dict(self.counts),
            "total": self.total,
            "done": self.done,
            "running": [asdict(r) for r in self.running],
            "left": self.left,
            "resumable": self.resumable,
            "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
            "updates_per_s": self.updates_per_s,
        }

    def line(self) -> str:
        """One plain line (for pipes and CI logs)."""
        ended = ", ".join(
            f"{s} {self.counts[s]}" for s in RUN_STATUSES if s in ENDED_STATUSES and self.counts[s]
        )
        parts = [
            f"{self.campaign}: {self.done}/{self.total} done" + (f" ({ended})" if ended else ""),
            f"{len(self.running)} running",
            f"{self.left} left",
        ]
        if self.running:
            parts.append(
                "updates " + " ".join(f"{r.run_id[-6:]}:{r.step}/{r.updates}" for r in self.running)
            )
        parts.append(f"ETA {format_duration(self.eta_s)}")
        return ", ".join(parts)


def take_snapshot(ledger: Ledger, campaign: str, workers: int | None = None) -> Snapshot:
    """Read the campaign's state from the ledger."""
    runs = ledger.runs(campaign)
    counts = {s: int((runs["status"] == s).sum()) for s in RUN_STATUSES}
    updates = {
        str(r.run_id): int(_config(r.config)["budget"]["updates"] or 0)
        for r in runs.itertuples()
    }
    running_rows = runs[runs["status"] == "running"]
    active = list(running_rows["run_id"])
    steps = ledger.latest_steps(active) if active else {}
    now = pd.Timestamp(ledger.database_now()) if active else None
    running = tuple(
        RunningRun(
            run_id=str(r.run_id),
            variant=str(r.variant),
            seed=int(r.seed),
            worker=r.worker,
            step=steps.get(str(r.run_id), 0),
            updates=updates[str(r.run_id)],
            heartbeat_age_s=_age(now, r.heartbeat_at),
        )
        for r in running_rows.itertuples()
    )
    rate = _updates_per_second(runs, ledger)
    remaining = sum(updates[str(r)] for r in runs[runs["status"] == "planned"]["run_id"]) + sum(
        max(0, r.updates - r.step) for r in running
    )
    parallel = max(1, workers or len(running) or 1)
    eta = None if rate is None else remaining / (rate * parallel)
    return Snapshot(campaign, counts, running, eta, rate)


def _updates_per_second(runs: pd.DataFrame, ledger: Ledger) -> float | None:
    """Updates per second of one worker, from the runs that ended (their stop step and
    time from start to end)."""
    ended = runs[runs["status"].isin(sorted(TERMINAL_STATUSES)) & runs["started_at"].notna()]
    if ended.empty:
        return None
    seconds = (ended["ended_at"].map(_utc) - ended["started_at"].map(_utc)).dt.total_seconds()
    steps = ended["stop_step"].fillna(0).astype(float)
    total = float(seconds.sum())
    return float(steps.sum()) / total if total > 0 and steps.sum() > 0 else None


def _age(now: pd.Timestamp | None, moment: Any) -> float | None:
    if now is None or pd.isna(moment):
        return None
    return round((now - _utc(moment)).total_seconds(), 1)


def _config(value: Any) -> dict[str, Any]:
    return json.loads(value) if isinstance(value, str) else value


def _utc(moment: Any) -> pd.Timestamp:
    stamp = pd.Timestamp(moment)
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


def format_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "unknown"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class ProgressDisplay:
    """A live table on a terminal (rich); on a pipe, a plain line whenever the counts change.

    Quiet on pipes and in CI except for those lines, as DESIGN.md §11 asks.
    """

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self._last_key: Any = None
        self._live: Any = None

    def show(self, snapshot: Snapshot) -> None:
        if self.live:
            self._show_live(snapshot)
            return
        key = (tuple(sorted(snapshot.counts.items())), len(snapshot.running))
        if key != self._last_key:
            self._last_key = key
            print(snapshot.line(), file=self.stream, flush=True)

    def _show_live(self, snapshot: Snapshot) -> None:
        from rich.console import Console
        from rich.live import Live

        if self._live is None:
            self._live = Live(console=Console(file=self.stream), refresh_per_second=4)
            self._live.start()
        self._live.update(render_table(snapshot))

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def render_table(snapshot: Snapshot) -> Any:
    """The rich renderable of a snapshot: a summary caption over the running runs."""
    from rich.table import Table

    table = Table(title=snapshot.line().split(", updates")[0], title_justify="left")
    for column in ("run", "variant", "seed", "worker", "update", "heartbeat"):
        table.add_column(column)
    for run in snapshot.running:
        share = f"{run.step}/{run.updates}"
        age = "" if run.heartbeat_age_s is None else f"{run.heartbeat_age_s:.0f}s ago"
        table.add_row(run.run_id, run.variant, str(run.seed), run.worker or "", share, age)
    return table
