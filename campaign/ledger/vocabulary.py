"""The ledger's fixed words: run statuses, stop causes and the legal transitions.

These are contract (docs/runs.md): scripts and SQL users match on the exact
strings. The database enforces the same rules with CHECK constraints and
triggers; the migrations carry their own frozen copy of these lists so that an
old migration never changes meaning when this module grows.
"""

from __future__ import annotations

from typing import Final

PLANNED: Final = "planned"
RUNNING: Final = "running"

RUN_STATUSES: Final = (
    "planned",
    "running",
    "completed",
    "diverged",
    "stopped",
    "failed",
    "oom",
    "interrupted",
    "lost",
    "withdrawn",
)
WITHDRAWN: Final = "withdrawn"
# Where a run that ran can end (a withdrawn run never ran).
FINISHED_STATUSES: Final = frozenset({"completed", "diverged", "stopped", "failed", "oom"})
TERMINAL_STATUSES: Final = FINISHED_STATUSES | {WITHDRAWN}
RESUMABLE_STATUSES: Final = frozenset({"interrupted", "lost"})
ENDED_STATUSES: Final = FINISHED_STATUSES | RESUMABLE_STATUSES

STOP_CAUSES: Final = (
    "budget_reached",
    "non_finite_loss",
    "non_finite_grad",
    "loss_explosion",
    "early_stop",
    "wall_time",
    "out_of_memory",
    "exception",
    "interrupted",
    "preempted",
    "heartbeat_lost",
    "stalled",
    "killed",
    "ledger_unreachable",
    "pruned",
)

# Which stop causes make sense for which end status. The database only checks
# that an ended run has *a* cause; this finer mapping is checked by the API so
# that a balance sheet never shows "completed / out_of_memory".
CAUSES_BY_STATUS: Final[dict[str, frozenset[str]]] = {
    "completed": frozenset({"budget_reached", "early_stop"}),
    # pruned: a search's recorded decision at a rung (campaign/search/), the run paused there
    "stopped": frozenset({"early_stop", "wall_time", "pruned"}),
    "diverged": frozenset({"non_finite_loss", "non_finite_grad", "loss_explosion"}),
    "oom": frozenset({"out_of_memory"}),
    # killed: a signal nobody of ours sent; the second kill at one update is a verdict
    "failed": frozenset({"exception", "stalled", "killed"}),
    "interrupted": frozenset({"interrupted", "preempted", "killed", "ledger_unreachable"}),
    "lost": frozenset({"heartbeat_lost"}),
}

TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    "planned": frozenset({"running", "withdrawn"}),
    "running": ENDED_STATUSES,
    # interrupted -> stopped: only a run paused at a search's rung, pruned there (0009)
    "interrupted": frozenset({"running", "stopped"}),
    "lost": frozenset({"running"}),
}

# How a run's stop detail says it is paused at a search's rung (interrupted/preempted) until
# the rung's decision continues or prunes it: it waits, and is never resumed by hand.
PAUSED_AT_RUNG: Final = "search: paused at rung"


def paused_at_rung(status: object, stop_detail: object) -> bool:
    """Whether a run is paused at a search's rung (its decision, not a resume, moves it)."""
    return (status == "interrupted" and isinstance(stop_detail, str)
            and stop_detail.startswith(PAUSED_AT_RUNG))

ARTIFACT_KINDS: Final = (
    "checkpoint", "final", "predictions", "report", "config", "log", "traceback",
)
PHASES: Final = (
    "data",
    "forward",
    "backward",
    "update",
    "validation",
    "checkpoint",
    "resume",
    "export",
)


def can_transition(current: str, new: str) -> bool:
    """True when the run-status graph of docs/runs.md allows ``current -> new``."""
    return new in TRANSITIONS.get(current, frozenset())
