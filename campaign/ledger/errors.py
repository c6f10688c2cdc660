"""Errors of the ledger. Every one carries one clear line for the user.

The command line maps :class:`LedgerError` to exit code 3 (ledger problem) and
:class:`LedgerInputError` to exit code 2 (bad input), DESIGN.md §11.
"""

from __future__ import annotations


class LedgerError(Exception):
    """A ledger problem: unreachable, wrong revision, refused write."""


class LedgerUrlError(LedgerError):
    """The ledger URL is malformed or names an unsupported database."""


class LedgerUnreachable(LedgerError):
    """The database could not be opened or connected to."""


class NotALedger(LedgerError):
    """The database exists but is not a campaign ledger."""


class LedgerRevisionError(LedgerError):
    """The ledger's schema revision is older or newer than this code's."""


class RefusedWrite(LedgerError):
    """The database refused a write (immutability trigger or constraint)."""


class IllegalTransition(RefusedWrite):
    """A run status change that the status graph does not allow."""


class LedgerInputError(ValueError):
    """Bad input to the ledger API: unknown campaign or run, bad value."""


class NotFound(LedgerInputError):
    """A campaign, run or segment that the ledger does not hold."""


class LeaseLost(RefusedWrite):
    """A worker wrote under a lease it no longer holds: its run was declared lost or reclaimed.

    The worker must stop at once: another worker may be executing the run.
    """


class NoLedger(LedgerError):
    """No ledger where one was named (a SQLite file that does not exist): nothing was created."""
