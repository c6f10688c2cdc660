"""How a run ended, in a module without torch: the supervisor and the launcher read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended, as returned to whoever placed it (the ledger holds the same)."""

    run_id: str
    status: str
    cause: str
    step: int
    detail: str
