"""What a dashboard page asks for every second or two: the campaign's state and only new points.

The page holds a *cursor* the server gave it: the database time of its last
poll, a digest of every run's status, and for each run still open (started,
not terminal) the newest segment and the step it has shown up to. A poll
then reads:

1. the campaign's runs (lean rows, one indexed query) and the running runs'
   latest update (one index seek each);
2. the newest segment of the open runs, so a resume that re-ran steps after
   its checkpoint replaces them (the page is told to cut its curve there);
3. the points at or after each open run's shown step, and every point of a
   run that started since the last poll (primary-key ranges).

With nothing new, that is three small indexed queries and a reply of a few
hundred bytes: no run list (the digest matches), no points. Points are
re-read from the shown step itself (``>=``), since two keys of one update may
be committed in different batches; the page keeps a point only when it is
newer than what it has for that run and key.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from campaign.errors import LedgerInputError, NotFound
from campaign.ledger import LedgerReader
from campaign.ledger.progress import Snapshot, snapshot_of
from campaign.ledger.vocabulary import TERMINAL_STATUSES

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

# A run the last poll did not see open (not in the cursor) and now ended was either ended then
# (nothing to read) or not started yet: then it started after that poll's clock, which is read
# after its rows. The margin covers a start stamped just before its transaction committed; a
# run read twice costs nothing but bytes (the page keeps only newer steps).
START_SLACK = timedelta(seconds=1)


class BadCursor(LedgerInputError):
    """A cursor that this server did not make (edited, truncated, from another version)."""


@dataclass
class Cursor:
    """What the page has seen: poll time, status digest, open run -> [segment id, step]."""

    at: float
    digest: str
    open: dict[str, list[int]] = field(default_factory=dict)

    def encode(self) -> str:
        text = json.dumps(asdict(self), separators=(",", ":"))
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        try:
            raw = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
            cursor = cls(float(raw["at"]), str(raw["digest"]), {
                str(run): [int(pair[0]), int(pair[1])] for run, pair in raw["open"].items()
            })
            datetime.fromtimestamp(cursor.at, UTC)  # a time this server could have written
            if not 0 < cursor.at < 1e11:
                raise ValueError(cursor.at)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError, OverflowError,
                OSError, RecursionError):  # (a deeply nested document: the parser's limit)
            raise BadCursor(f"unreadable cursor {text[:40]!r}: not one this server made "
                            "(reload the page)") from None
        return cursor


@dataclass
class _State:
    """What a poll reads before any point: runs, their status, the open runs' segments."""

    campaign: str
    run_id: str | None
    cursor: Cursor | None
    now: datetime
    rows: list[dict[str, Any]]
    snapshot: Snapshot
    still_open: list[str]
    segments: dict[str, tuple[int, int]]


class Watcher:
    """One server's view of the ledger: polls, and the planned updates of every run it has seen
    (a run's config is immutable, so it is read once per run, never on the hot path again)."""

    def __init__(self, reader: LedgerReader) -> None:
        self.reader = reader
        self._planned: dict[str, int] = {}

    def poll(
        self,
        campaign: str,
        cursor: Cursor | None,
        keys: Sequence[str] | None,
        run_id: str | None = None,
    ) -> dict[str, Any]:
        """The reply to one poll (a JSON-able document); ``run_id`` narrows it to one run."""
        return self._reply(self._read_state(campaign, cursor, run_id), keys, None)

    def first_view(self, campaign: str, read_curves: Callable[[], pd.DataFrame]) -> dict[str, Any]:
        """What a campaign page starts from, with the points of a frame the page reads anyway
        (the balance sheet's curves): one read of every point instead of two. The runs and
        segments are read first, as for any poll, so nothing that ends meanwhile is missed."""
        state = self._read_state(campaign, None, None)
        return self._reply(state, None, read_curves())

    def _read_state(self, campaign: str, cursor: Cursor | None, run_id: str | None) -> _State:
        now, rows = self.reader.live_runs(campaign)
        if run_id is not None:
            rows = [row for row in rows if row["id"] == run_id]
            if not rows:
                raise NotFound(f"no run {run_id!r} in campaign {campaign!r}")
        unknown = [row["id"] for row in rows if row["id"] not in self._planned]
        self._planned.update(self.reader.planned_updates(unknown))
        for row in rows:
            row["updates"] = self._planned.get(row["id"], 0)
        running = [row["id"] for row in rows if row["status"] == "running"]
        snapshot = snapshot_of(campaign, now, rows, self.reader.latest_steps(running))
        still_open = [row["id"] for row in rows
                      if row["started_at"] is not None and row["status"] not in TERMINAL_STATUSES]
        seen = cursor.open if cursor is not None else {}
        segments = self.reader.latest_segments(sorted(set(still_open) | set(seen)))
        return _State(campaign, run_id, cursor, now, rows, snapshot, still_open, segments)

    def _reply(
        self, state: _State, keys: Sequence[str] | None, frame: pd.DataFrame | None
    ) -> dict[str, Any]:
        cursor, segments = state.cursor, state.segments
        seen = cursor.open if cursor is not None else {}
        starts, reset = self._starts(state.rows, cursor, segments)
        if cursor is None and state.run_id is None:  # a first load of a whole campaign
            if frame is None:
                frame = self.reader.metrics(state.campaign, keys=list(keys) if keys else None)
            arrays = _frame_arrays(frame, segments)
        else:
            found = self.reader.points_from(starts, keys)
            arrays = _row_arrays([p for p in found if _current(p[0], p[2], p[3], segments)])
        shown: dict[str, int] = {}
        for (_key, run), (steps, _values) in arrays.items():
            shown[run] = max(shown.get(run, 0), int(steps[-1]))
        digest = _digest(state.rows)
        had = {run: min(step, reset[run]) if run in reset else step  # what the page keeps
               for run, (_segment, step) in seen.items()}
        fresh = Cursor(state.now.timestamp(), digest, {
            run: [segments[run][0] if run in segments else 0,
                  max(shown.get(run, 0), had.get(run, 0))]
            for run in state.still_open
        })
        return {
            "now": state.now.isoformat(),
            "status": {**state.snapshot.document(), "summary": state.snapshot.summary()},
            "runs": None if cursor is not None and cursor.digest == digest
            else _run_list(state.rows),
            "points": _encoded(arrays),
            "reset": reset,
            "cursor": fresh.encode(),
        }

    def _starts(
        self, rows: list[dict[str, Any]], cursor: Cursor | None,
        segments: dict[str, tuple[int, int]],
    ) -> tuple[dict[str, int], dict[str, int]]:
        """The step to read each run's points from, and the runs whose newest segment is not the
        one the page has seen (their curve is cut after the start of the first newer one)."""
        changed = {run: pair[0] for run, pair in (cursor.open.items() if cursor else ())
                   if run in segments and segments[run][0] != pair[0]}
        starts_after = self.reader.segment_starts_after(changed)
        starts: dict[str, int] = {}
        reset: dict[str, int] = {}
        since = None if cursor is None else datetime.fromtimestamp(cursor.at, UTC) - START_SLACK
        for row in rows:
            run = row["id"]
            if row["started_at"] is None:
                continue
            if cursor is not None and run in cursor.open:
                segment, step = cursor.open[run]
                newest = segments.get(run)
                if newest is not None and newest[0] != segment:
                    # Resumed since: the page's curve is cut where the first segment newer
                    # than its own started (two resumes between polls: the earlier start),
                    # and read again from there, or from where the page was if that is earlier
                    # (a page that fell behind still gets the older segment's steps).
                    reset[run] = starts_after.get(run, newest[1])
                    step = min(step, reset[run] + 1)
                starts[run] = step
            elif (
                cursor is None
                or row["status"] not in TERMINAL_STATUSES
                or (since is not None and row["started_at"] >= since)
            ):
                starts[run] = 0
        return starts, reset


def _current(run: str, step: int, segment: int, segments: dict[str, tuple[int, int]]) -> bool:
    """False for a point an open run's newest segment re-runs (after its start step)."""
    newest = segments.get(run)
    return newest is None or step <= newest[1] or segment == newest[0]


def _frame_arrays(
    frame: pd.DataFrame, segments: dict[str, tuple[int, int]]
) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """(key, run) -> (steps, values) from a metrics frame (newest segment per step; an open
    run's points after its newest segment's start only from that segment)."""
    import numpy as np

    if frame.empty:
        return {}
    for run, (segment, start) in segments.items():
        stale = (frame["run_id"] == run) & (frame["step"] > start) & (
            frame["segment_id"] != segment)
        if stale.any():
            frame = frame[~stale]
    frame = frame.sort_values(["key", "run_id", "step"], kind="stable")
    runs = frame["run_id"].to_numpy()
    names = frame["key"].to_numpy()
    steps = frame["step"].to_numpy(dtype=np.int64)
    values = frame["value"].to_numpy(dtype=float, na_value=np.nan)
    bounds = np.flatnonzero(np.r_[True, (runs[1:] != runs[:-1]) | (names[1:] != names[:-1])])
    ends = np.r_[bounds[1:], len(runs)]
    return {(str(names[a]), str(runs[a])): (steps[a:b], values[a:b])
            for a, b in zip(bounds, ends, strict=True)}


def _row_arrays(
    rows: list[tuple[str, str, int, int, float | None]],
) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """(key, run) -> (steps, values) from rows in (run, key, step, segment) order; the newest
    segment wins a step."""
    import numpy as np

    lists: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
    for run, key, step, _segment, value in rows:
        steps, values = lists.setdefault((key, run), ([], []))
        number = math.nan if value is None else float(value)
        if steps and steps[-1] == step:
            values[-1] = number
        else:
            steps.append(step)
            values.append(number)
    return {pair: (np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=float))
            for pair, (steps, values) in lists.items()}


def _encoded(arrays: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    """key -> run -> {"s": steps, "v": values}: values as base64 little-endian float64 (exact,
    NaN and infinities kept, a third of the bytes of JSON numbers and no float formatting);
    steps as [first, stride, count] when evenly spaced (they nearly always are), else base64
    little-endian int32 (steps are at most 1e9)."""
    import numpy as np

    points: dict[str, Any] = {}
    for (key, run), (steps, values) in arrays.items():
        stride = int(steps[1] - steps[0]) if len(steps) > 1 else 1
        even = len(steps) < 2 or bool(np.all(np.diff(steps) == stride))
        points.setdefault(key, {})[run] = {
            "s": [int(steps[0]), stride, len(steps)] if even
            else base64.b64encode(steps.astype("<i4").tobytes()).decode(),
            "v": base64.b64encode(np.ascontiguousarray(values, dtype="<f8").tobytes()).decode(),
        }
    return points


def decoded(points: dict[str, Any]) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """The points of a reply as lists (what the page's script does; for tests and tools)."""
    import numpy as np

    out: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for key, by_run in points.items():
        for run, pair in by_run.items():
            if isinstance(pair["s"], list):
                first, stride, count = pair["s"]
                steps = [first + i * stride for i in range(count)]
            else:
                steps = np.frombuffer(base64.b64decode(pair["s"]), dtype="<i4").tolist()
            values = np.frombuffer(base64.b64decode(pair["v"]), dtype="<f8").tolist()
            out.setdefault(key, {})[run] = (steps, values)
    return out


def _digest(rows: list[dict[str, Any]]) -> str:
    text = "|".join(f"{r['id']}:{r['status']}:{r['stop_step']}" for r in rows)
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def _run_list(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the page needs to draw and colour each run (everything JSON-able)."""
    return [
        {"id": r["id"], "variant": r["variant"], "is_control": r["is_control"],
         "seed": int(r["seed"]), "status": r["status"], "original": r["relaunch_of"] is None,
         "stop_cause": r["stop_cause"], "stop_step": r["stop_step"]}
        for r in rows
    ]
