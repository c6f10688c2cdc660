"""The ledger's own rules, checked before a write: a plan's shape, an end's status and cause,
and the words a refused status change is explained with.

The database enforces the same rules (constraints, triggers); checking first
gives the user a message that names the run and the fix instead of a
driver error.
"""

from __future__ import annotations

from collections.abc import Sequence

from campaign.errors import LedgerInputError
from campaign.ledger.records import NewRun, NewVariant, StopRecord
from campaign.ledger.vocabulary import (
    CAUSES_BY_STATUS,
    ENDED_STATUSES,
    RESUMABLE_STATUSES,
    RUNNING,
    TERMINAL_STATUSES,
)


def check_plan(name: str, variants: Sequence[NewVariant], runs: Sequence[NewRun]) -> None:
    if not name.strip():
        raise LedgerInputError("a campaign needs a name")
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise LedgerInputError(f"campaign {name!r}: variant names must be unique")
    if variants and sum(v.is_control for v in variants) != 1:
        raise LedgerInputError(f"campaign {name!r}: exactly one variant must be the control")
    for run in runs:
        if run.variant not in names:
            raise LedgerInputError(f"campaign {name!r}: run names unknown variant {run.variant!r}")


def check_end(run_id: str, status: str, stop: StopRecord) -> None:
    if status not in ENDED_STATUSES:
        raise LedgerInputError(
            f"run {run_id}: {status!r} is not an end status "
            f"(expected one of {', '.join(sorted(ENDED_STATUSES))})"
        )
    allowed = CAUSES_BY_STATUS[status]
    if stop.cause not in allowed:
        raise LedgerInputError(
            f"run {run_id}: stop cause {stop.cause!r} does not fit status {status!r} "
            f"(expected {', '.join(sorted(allowed))})"
        )


def transition_refusal(run_id: str, current: str, new: str) -> str:
    if current in TERMINAL_STATUSES:
        return f"run {run_id} is {current}, a terminal status: it is final (relaunch it instead)"
    if current == RUNNING and new == RUNNING:
        return f"run {run_id} is already running"
    hint = " (resume it)" if current in RESUMABLE_STATUSES else ""
    return f"run {run_id} cannot go from {current} to {new}{hint}"
