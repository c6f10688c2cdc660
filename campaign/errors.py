"""Every error the project raises on purpose, each carrying its exit code: the bottom layer.

Any layer raises these and any layer above catches them; this module imports nothing of ours
and nothing heavy, so the command line catches them without paying for torch or SQLAlchemy.
The command line reads ``exit_code`` off the exception it caught (docs/cli.md, "Exit codes"):
there is no table from class names to codes to keep in step. An error that crossed a process
boundary (a task host's child) comes back as itself when it is one of these classes, else as a
:class:`HostedError` carrying the original's code. Docs: docs/architecture.md (layers).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The command line's exit codes (contract, docs/cli.md)."""

    OK = 0
    CHECK_FAILED = 1  # the checked thing failed: a pilot gate, a run, a closed launch gate
    BAD_INPUT = 2  # bad usage or bad input (click's own usage errors exit 2 too)
    LEDGER = 3  # ledger problem: unreachable, unknown or outdated revision, refused write


class CampaignError(Exception):
    """An error of the project's: its message is the one line the user sees."""

    exit_code: ExitCode = ExitCode.BAD_INPUT


# -- bad input (exit 2) ---------------------------------------------------------------------


class BadInput(CampaignError):
    """A user's input the command cannot use (a path it cannot write, ...): one line, exit 2,
    without click's usage text (which says nothing about a path)."""


class SpecError(CampaignError, ValueError):
    """A spec that cannot be planned; the message is the one line the user sees."""


class LoopError(CampaignError, ValueError):
    """A run that cannot be executed as configured (said before any work)."""


class OrderEnded(LoopError):
    """A task's own order has no more updates (campaign/loop/task_order.py): the run fails at
    the update it needed; a loader drawing ahead stops there instead (the run may never need
    that update)."""


class TaskContractError(CampaignError, ValueError):
    """The task does not import, cannot be built, or lacks a part of the contract."""


class InitError(CampaignError):
    """The folder cannot take a skeleton (it holds one of its files, or cannot be made)."""


class PlacementError(CampaignError, RuntimeError):
    """An executor cannot place this campaign (missing extra, no scheduler, impossible
    request)."""


class ServeError(CampaignError):
    """A setting the dashboard cannot start with (address, port, token): one line."""


class ExportError(CampaignError):
    """A TensorBoard export that cannot proceed (a missing extra, a log folder that is not
    ours): one line."""


class RunRefused(CampaignError):
    """``run`` or ``resume`` asked for what this machine cannot do (a device it does not have,
    a requirement the task declares and this stack misses): nothing was claimed or changed,
    and the run keeps its status."""


class TaskReferenceError(CampaignError, ValueError):
    """A task reference that does not import or does not name a callable; the message says
    which."""


# -- the checked thing failed (exit 1) ------------------------------------------------------


class DeviceUnavailable(LoopError):
    """A device that is a valid name but cannot run here (exit 1: the checked thing)."""

    exit_code = ExitCode.CHECK_FAILED


RESUME_REFUSED = "stays interrupted, its resume refused"  # a resume that could not start


class RunSetupFailed(LoopError):
    """The run was taken and could not be built; its end is recorded: ``failed`` for a first
    start, ``interrupted`` (resumable, nothing lost) for a resume (``status``)."""

    exit_code = ExitCode.CHECK_FAILED

    def __init__(self, message: str, status: str = "failed") -> None:
        super().__init__(message)
        self.status = status


class StackRefused(RunSetupFailed):
    """This worker's software stack or device cannot run the campaign's runs as declared."""


class CheckpointError(CampaignError, ValueError):
    """A checkpoint that must not be loaded: missing, torn, tampered with, not ours."""

    exit_code = ExitCode.CHECK_FAILED


class GateClosed(CampaignError):
    """A run's gate class has no passing pilot and nobody recorded a decision to skip it."""

    exit_code = ExitCode.CHECK_FAILED


class ArchiveError(CampaignError):
    """An archive that cannot be written or does not verify; the message names the member."""

    exit_code = ExitCode.CHECK_FAILED


class ArchiveUnusable(ArchiveError):
    """Not an archive this tool can check: missing, not a .tar.gz, no or a malformed manifest
    (bad input, exit 2)."""

    exit_code = ExitCode.BAD_INPUT


class ReproduceError(CampaignError):
    """A piece of the archive is missing, changed or unusable; the message names it."""

    exit_code = ExitCode.CHECK_FAILED


class UntrustedCode(ReproduceError):
    """An archive's own task code, which ``reproduce`` runs only when told to
    (``--trust-task-code``): a refusal of the command as given, before anything ran."""

    exit_code = ExitCode.BAD_INPUT


# -- the ledger (exit 3, or 2 for bad input to its API) -------------------------------------


class LedgerError(CampaignError):
    """A ledger problem: unreachable, wrong revision, refused write."""

    exit_code = ExitCode.LEDGER


class LedgerUrlError(LedgerError):
    """The ledger URL is malformed or names an unsupported database."""


class LedgerUnreachable(LedgerError):
    """The database could not be opened or connected to."""


class LedgerUnwritable(LedgerUnreachable):
    """The ledger's file cannot take writes (a full or read-only volume): a worker claims
    nothing; a run rides it out like an outage, then ends ``interrupted``."""


class NotALedger(LedgerError):
    """The database exists but is not a campaign ledger."""


class LedgerRevisionError(LedgerError):
    """The ledger's schema revision is older or newer than this code's."""


class RefusedWrite(LedgerError):
    """The database refused a write (immutability trigger or constraint)."""


class IllegalTransition(RefusedWrite):
    """A run status change that the status graph does not allow."""


class LeaseLost(RefusedWrite):
    """A worker wrote under a lease it no longer holds: its run was declared lost or reclaimed.

    The worker must stop at once: another worker may be executing the run.
    """


class NoLedger(LedgerError):
    """No ledger where one was named (a SQLite file that does not exist): nothing was created."""


class LedgerInputError(CampaignError, ValueError):
    """Bad input to the ledger API: unknown campaign or run, bad value."""


class NotFound(LedgerInputError):
    """A campaign, run or segment that the ledger does not hold."""


# -- crossing a process boundary ------------------------------------------------------------


class HostedError(CampaignError):
    """A project error raised in a task host's child, carried back with its exit code (its
    class cannot cross the boundary, its code does)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        codes = {int(c) for c in ExitCode}
        self.exit_code = ExitCode(exit_code) if exit_code in codes else ExitCode.BAD_INPUT


def exit_code_of(error: BaseException) -> ExitCode | None:
    """The contract's exit code for ``error``; None when it is not one of the project's."""
    return error.exit_code if isinstance(error, CampaignError) else None


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its type name when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
