"""The pilot gate's rule, one pure function: the launch applies it now, the report applies it
at each run's start to tell which runs went through a passing pilot.

At a moment: when the latest pilot of the frozen spec decided by then passed, the gate is
open by that pilot; otherwise, when someone recorded a decision to skip the pilot
(``--skip-pilot --reason``) by then, it is open by that decision; otherwise it is closed.
Plain Python and no import of ours: ``launch`` and ``report`` both use it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

PILOT_EVENT = re.compile(r"pilot (\d+) ")  # the start of a pilot's verdict event


@dataclass(frozen=True)
class GateState:
    how: str  # "pass" (a passing pilot), "skip" (a recorded skip), "closed"
    evidence: Any = None  # the passing pilot's software stack, or the skip's reason


def gate_state(
    pilots: Sequence[Mapping[str, Any]],
    skips: Sequence[Mapping[str, Any]],
    moment: datetime | None = None,
) -> GateState:
    """``pilots``: the frozen spec's pilots in creation order, each with ``verdict``,
    ``decided_at`` and ``environment``; ``skips``: the skip decisions in order, each with
    ``at`` and ``detail``. ``moment`` None means now (everything recorded counts)."""

    def by(at: datetime | None) -> bool:
        return moment is None or (at is not None and at <= moment)

    decided = [p for p in pilots if p.get("verdict") is not None and by(p.get("decided_at"))]
    if decided and decided[-1]["verdict"] == "pass":
        return GateState("pass", decided[-1].get("environment"))
    earlier = [s for s in skips if by(s.get("at"))]
    if earlier:
        return GateState("skip", earlier[-1].get("detail"))
    return GateState("closed")


def pilot_decisions(
    pilots: Any, events: Any, spec_sha256: str, gate_class: str | None = None
) -> list[dict[str, Any]]:
    """The ``pilots`` argument of :func:`gate_state` from the ledger's ``pilots`` and
    ``events`` frames, for one gate class (a pilot recorded before pilots had classes speaks
    for every class). A pilot's verdict time is its ``pilot`` event's (it is created before
    it measures); a pilot without that event counts from its creation."""
    decided: dict[int, Any] = {}
    for kind, detail, at in zip(events["kind"], events["detail"], events["at"], strict=True):
        found = PILOT_EVENT.match(str(detail)) if kind == "pilot" else None
        if found:
            decided[int(found.group(1))] = at
    return [
        {"verdict": verdict if isinstance(verdict, str) else None,
         "decided_at": decided.get(int(pilot_id), created), "environment": stack}
        for pilot_id, sha, verdict, stack, created, cls in zip(
            pilots["pilot_id"], pilots["config_sha256"], pilots["verdict"],
            pilots["environment"], pilots["created_at"], _classes(pilots), strict=True)
        if sha == spec_sha256 and (gate_class is None or not isinstance(cls, str)
                                   or cls == gate_class)
    ]


@dataclass(frozen=True)
class SkipDecisions:
    """The recorded decisions to skip the pilot: per run (one event per run it covers), and
    campaign-wide (a ledger written before skips were recorded per run: every run)."""

    everywhere: list[dict[str, Any]]
    per_run: dict[str, list[dict[str, Any]]]

    def of(self, run_id: str) -> list[dict[str, Any]]:
        """The skips that cover ``run_id``, oldest first."""
        return sorted(self.everywhere + self.per_run.get(run_id, []), key=lambda s: s["at"])


def skip_decisions(events: Any) -> SkipDecisions:
    """The ``skips`` arguments of :func:`gate_state`, read once from the ``events`` frame."""
    found = SkipDecisions([], {})
    for kind, run_id, at, detail in zip(events["kind"], events["run_id"], events["at"],
                                        events["detail"], strict=True):
        if kind == "pilot_skipped":
            target = (found.per_run.setdefault(run_id, []) if isinstance(run_id, str)
                      else found.everywhere)
            target.append({"at": at, "detail": detail})
    return found


def _classes(pilots: Any) -> Any:
    return pilots["gate_class"] if "gate_class" in pilots else [None] * len(pilots["pilot_id"])
