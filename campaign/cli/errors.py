"""The exit code for a project error (DESIGN.md §11), without importing the modules that
define the errors: an error of a module that was never imported cannot have been raised,
so each class is looked up only in modules already loaded."""

from __future__ import annotations

import sys

EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_LEDGER = 3



class BadInput(Exception):
    """A user's input the command cannot use (a path it cannot write, ...): one line, exit 2,
    without click's usage text (which says nothing about a path)."""


# (module, class name, exit code), the most specific first.
ERRORS: tuple[tuple[str, str, int], ...] = (
    ("campaign.cli.errors", "BadInput", EXIT_BAD_INPUT),
    ("campaign.ledger.errors", "LedgerError", EXIT_LEDGER),
    ("campaign.ledger.errors", "LedgerInputError", EXIT_BAD_INPUT),
    ("campaign.plan.spec_error", "SpecError", EXIT_BAD_INPUT),
    ("campaign.loop.errors", "RunSetupFailed", EXIT_CHECK_FAILED),
    ("campaign.loop.errors", "DeviceUnavailable", EXIT_CHECK_FAILED),
    ("campaign.gates.launch_gate", "GateClosed", EXIT_CHECK_FAILED),
    ("campaign.loop.errors", "CheckpointError", EXIT_CHECK_FAILED),
    ("campaign.loop.errors", "LoopError", EXIT_BAD_INPUT),
    ("campaign.loop.errors", "TaskContractError", EXIT_BAD_INPUT),
)


def exit_code_for(error: BaseException) -> int | None:
    """The contract's exit code for ``error``; None when it is not one of the project's. An
    error raised in a child of the task host names the classes it derives from."""
    hosted = getattr(error, "classes", None)
    if type(error).__name__ == "HostedError" and hosted is not None:
        return next((code for module, name, code in ERRORS if (module, name) in hosted), None)
    for module_name, class_name, code in ERRORS:
        module = sys.modules.get(module_name)
        kind = getattr(module, class_name, None) if module is not None else None
        if kind is not None and isinstance(error, kind):
            return code
    return None
