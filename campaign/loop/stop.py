"""Stop rules, decided by the frozen config before launch (docs/runs.md (stop causes)).

Each rule looks at what the loop just measured and either lets the run go on
or returns a :class:`StopDecision`: the end status, the cause, and a human detail.
The loop adds the step and phase and writes it in one transaction.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from campaign.errors import LedgerUnreachable, first_line
from campaign.ledger.canonical import canonical_json
from campaign.ledger.vocabulary import PAUSED_AT_RUNG
from campaign.loop.storage_faults import out_of_storage, storage_stop_detail

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class StopDecision:
    """A stop rule's decision: how the run ends (the ledger stores it as a ``StopRecord``)."""

    status: str
    cause: str
    detail: str
    phase: str | None = None  # where it was decided, when not the loop's current phase
    step: int | None = None  # the update it happened in, when not the last one completed


PAUSED = PAUSED_AT_RUNG  # how a run's stop detail says it waits for a search's decision


def pause_detail(rung: int) -> str:
    """A search's run paused at its rung (campaign/search/): the scheduler takes the slot back
    until every variant of the rung has reported (docs/search.md)."""
    return (f"{PAUSED} {rung} until every variant of the rung reports; the search's decision "
            "continues or prunes it")


def validates_after(step: int, validation: Mapping[str, Any]) -> bool:
    """Whether the loop validates after update ``step``: at ``offset``, ``offset + every``,
    ... (``validation.offset``, 0 by default: every, 2 x every, ...; docs/spec.md)."""
    every, offset = int(validation["every"]), int(validation.get("offset") or 0)
    return step >= 1 and (step - offset) % every == 0


def parse_duration(text: str | None) -> float | None:
    """``"30m"`` -> 1800.0 seconds; None stays None."""
    if text is None:
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text)
    if match is None:
        raise ValueError(f"expected a duration such as 30m, got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


class StopRules:
    """The stop rules of one run, from its config's ``stop``, ``validation`` and ``budget``."""

    def __init__(self, config: Mapping[str, Any], started: float | None = None) -> None:
        stop = config.get("stop", {})
        validation = config.get("validation", {})
        self.updates = int(config["budget"]["updates"])
        self.explosion = stop.get("loss_explosion")
        self.patience = int(stop.get("patience") or 0)
        self.wall_time = parse_duration(stop.get("wall_time"))
        self.mode = validation.get("mode", "max")
        self.started = time.monotonic() if started is None else started
        # A search's rung where the run pauses for the rung's decision (campaign/search/).
        self.pause_at: int | None = None
        self.first_loss: float | None = None
        self.best: float | None = None
        self.since_best = 0

    def state(self) -> dict[str, Any]:
        """What a resume needs (the wall-time clock restarts with each segment)."""
        return {"first_loss": self.first_loss, "best": self.best, "since_best": self.since_best}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.first_loss = state.get("first_loss")
        self.best = state.get("best")
        self.since_best = int(state.get("since_best", 0))

    def after_loss(self, loss: float) -> StopDecision | None:
        if not math.isfinite(loss):
            return StopDecision("diverged", "non_finite_loss", f"loss is {loss}")
        if self.first_loss is None:
            self.first_loss = loss
        elif self.explosion is not None and loss > self.explosion * self.first_loss:
            return StopDecision(
                "diverged",
                "loss_explosion",
                f"loss {loss:.4g} > {self.explosion:g} x first loss {self.first_loss:.4g}",
            )
        return None

    def after_gradients(self, grad_norm: float) -> StopDecision | None:
        if not math.isfinite(grad_norm):
            return StopDecision("diverged", "non_finite_grad", f"gradient norm is {grad_norm}")
        return None

    def after_update(self, step: int) -> StopDecision | None:
        if step >= self.updates:
            return StopDecision(
                "completed", "budget_reached", f"{step} of {self.updates} updates done"
            )
        if self.pause_at is not None and step >= self.pause_at:
            return StopDecision("interrupted", "preempted", pause_detail(self.pause_at))
        if self.wall_time is not None and time.monotonic() - self.started > self.wall_time:
            elapsed = time.monotonic() - self.started
            return StopDecision(
                "stopped", "wall_time", f"{elapsed:.1f} s elapsed, limit {self.wall_time:g} s"
            )
        return None

    def after_validation(self, value: float | None) -> StopDecision | None:
        if value is None or not math.isfinite(value):
            return None
        better = self.best is None or (
            value > self.best if self.mode == "max" else value < self.best
        )
        if better:
            self.best, self.since_best = value, 0
            return None
        self.since_best += 1
        if self.patience and self.since_best >= self.patience:
            return StopDecision(
                "stopped",
                "early_stop",
                f"no improvement of the validation metric for {self.since_best} "
                f"validations (best {self.best:.4g})",
            )
        return None


def failure_decision(error: BaseException, phase: str, step: int, run_id: str,
                     ending: str | None = None) -> StopDecision:
    """How a run ends after ``error`` in ``phase`` (``ending``: the cause of the stop it was
    ending): ``failed`` for good, except a volume with no space left, where nothing is lost
    but the updates since the last checkpoint: ``interrupted``, resumable once there is
    space (a full artifacts disk never ends a run ``completed`` nor loses its seed)."""
    full = out_of_storage(error)
    where = "" if ending is None else "while ending: "
    if full is not None:
        return StopDecision("interrupted", "interrupted",
                            where + storage_stop_detail(full, phase, step, run_id))
    if isinstance(error, LedgerUnreachable):  # locked past the run's patience, or gone
        return StopDecision("interrupted", "ledger_unreachable", f"{where}{first_line(error)} in "
                            f"{phase} at update {step}; `campaign resume {run_id}` continues "
                            "from its last checkpoint")
    where = "" if ending is None else f"while ending ({ending}): "
    return StopDecision("failed", "exception", f"{where}{type(error).__name__}: "
                                               f"{first_line(error)}")


def oom_detail(error: BaseException, phase: str, inputs: Mapping[str, Any]) -> str:
    """An out-of-memory stop's detail: where, on what, and the relaunch that fits it. In
    validation, the validation batch (``validation.microbatch``, else the update's examples)
    is what ran out, not the last training update's shapes; halving it changes no result."""
    detail = f"{first_line(error)} in {phase} with inputs {canonical_json(dict(inputs))}"
    if phase == "validation" and inputs.get("validation_batch"):
        half = max(1, int(inputs["validation_batch"]) // 2)
        return (detail + f"; relaunch with --set validation.microbatch={half} (the training "
                "updates stay as they were)")
    microbatch = int(inputs.get("microbatch") or 0)
    if microbatch > 1:
        return (detail + f"; relaunch with --set loop.microbatch={microbatch // 2} and double "
                "loop.accumulation (the same examples per update)")
    return detail
