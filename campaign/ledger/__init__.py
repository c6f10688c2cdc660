"""The campaign ledger: schema, migrations, the Ledger API. Imports nothing else of ours."""

from campaign.ledger.errors import (
    IllegalTransition,
    LedgerError,
    LedgerInputError,
    LedgerRevisionError,
    LedgerUnreachable,
    LedgerUrlError,
    NotALedger,
    NotFound,
    RefusedWrite,
)
from campaign.ledger.records import CampaignRecord, Claim, NewRun, NewVariant, RunRecord, StopInfo
from campaign.ledger.store import Ledger

__all__ = [
    "CampaignRecord",
    "Claim",
    "IllegalTransition",
    "Ledger",
    "LedgerError",
    "LedgerInputError",
    "LedgerRevisionError",
    "LedgerUnreachable",
    "LedgerUrlError",
    "NewRun",
    "NewVariant",
    "NotALedger",
    "NotFound",
    "RefusedWrite",
    "RunRecord",
    "StopInfo",
]
