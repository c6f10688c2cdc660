"""The campaign ledger: schema, migrations, the Ledger API. Imports nothing else of ours.

Names are loaded on first use (PEP 562): ``from campaign.errors import
LedgerError`` or the default URL must not pull in SQLAlchemy and pandas.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from campaign.errors import (
        IllegalTransition,
        LedgerError,
        LedgerInputError,
        LedgerRevisionError,
        LedgerUnreachable,
        LedgerUrlError,
        NoLedger,
        NotALedger,
        NotFound,
        RefusedWrite,
    )
    from campaign.ledger.reads import LedgerReader
    from campaign.ledger.records import (
        CampaignRecord,
        Claim,
        NewRun,
        NewVariant,
        RunRecord,
        StopRecord,
    )
    from campaign.ledger.store import Ledger

_WHERE = {
    **dict.fromkeys(
        ("IllegalTransition", "LedgerError", "LedgerInputError", "LedgerRevisionError",
         "LedgerUnreachable", "LedgerUrlError", "NoLedger", "NotALedger", "NotFound",
         "RefusedWrite"),
        "campaign.errors",
    ),
    **dict.fromkeys(
        ("CampaignRecord", "Claim", "NewRun", "NewVariant", "RunRecord", "StopRecord"),
        "campaign.ledger.records",
    ),
    "LedgerReader": "campaign.ledger.reads",
    "Ledger": "campaign.ledger.store",
}

__all__ = [
    "CampaignRecord",
    "Claim",
    "IllegalTransition",
    "Ledger",
    "LedgerError",
    "LedgerInputError",
    "LedgerReader",
    "LedgerRevisionError",
    "LedgerUnreachable",
    "LedgerUrlError",
    "NewRun",
    "NewVariant",
    "NoLedger",
    "NotALedger",
    "NotFound",
    "RefusedWrite",
    "RunRecord",
    "StopRecord",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'campaign.ledger' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
