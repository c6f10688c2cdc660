"""The notebook's ``Ledger``: the ledger's reads and writes plus the report's conveniences.

``campaign.ledger`` imports nothing else of ours but the errors (docs/architecture.md), so the
balance sheet, which is report code, is added one layer above it: ``from
campaign import Ledger`` gives this class, named apart from the ledger's own ``Ledger``,
which it extends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from campaign import ledger

if TYPE_CHECKING:
    from campaign.report.balance import BalanceSheet


class NotebookLedger(ledger.Ledger):
    """A campaign ledger with ``balance(campaign)``, the frames ``campaign report`` exports."""

    def balance(self, campaign: str) -> BalanceSheet:
        """The campaign's balance sheet (``.runs``, ``.variants``, ``.deltas``, ``.phases``,
        ``.notes`` DataFrames)."""
        from campaign.report.balance import balance_sheet  # pandas work, only when asked

        return balance_sheet(self, campaign)
