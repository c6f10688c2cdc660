"""``campaign inspect`` from the asking side: the ledger is read here, the task's examples
in a guarded child of the task host (:func:`campaign.pilot.inspect.inspect_task`), so the
command imports no torch and a task that hangs or exits ends as one error line."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from campaign.host import calls
from campaign.pilot.pilot_entries import inspect_task

if TYPE_CHECKING:
    from campaign.ledger.reads import LedgerReader


def inspect_campaign(ledger: LedgerReader, campaign: str, split: str, count: int) -> dict[str, Any]:
    """What ``campaign inspect`` shows, with the control's config: examples, a summary of the
    split and the data gate's findings (``passed`` says whether every check held)."""
    record = ledger.campaign(campaign)
    runs = ledger.runs(campaign)
    config = runs[runs["is_control"]].iloc[0]["config"]
    inspected: dict[str, Any] = calls.call(
        inspect_task, record.task, config, campaign, split, count,
        what=f"inspecting the {split} split", task=record.task)
    return inspected
