"""A worker's part in a search (docs/search.md): before each claim it asks the conductor to
take the steps that are due, continues the paused runs a rung's decision kept, pilots a gate
class a proposal brought before any of its runs trains, and waits while the search still
depends on runs other workers are running.

The conductor and the pilot run in children of the task host (pandas, Optuna and torch are
imported there): the worker process imports none of them.
"""

from __future__ import annotations

from typing import Any

from campaign.host import calls
from campaign.ledger import Ledger
from campaign.plan.search_spec import search_plan


def is_search(ledger: Ledger, campaign: str) -> bool:
    return search_plan(ledger.campaign(campaign).spec_document) is not None


def look(ledger: Ledger, campaign: str) -> dict[str, Any]:
    """The conductor's outlook (``continuing``, ``finished``, ``steps``), its steps taken."""
    from campaign.search.conduct import advance_at

    url = ledger.engine.url.render_as_string(hide_password=False)
    task = ledger.campaign(campaign).task
    return calls.call(advance_at, url, campaign, task=task,
                      what="taking the search's due steps")


def is_paused(row: dict[str, Any]) -> bool:
    """A run paused at a rung: only the rung's decision continues it (never a plain resume)."""
    from campaign.loop.stop import PAUSED

    detail = row.get("stop_detail")
    return isinstance(detail, str) and detail.startswith(PAUSED)


def pilot_new_classes(ledger: Ledger, campaign: str, artifacts: str, device: str,
                      run_ids: list[str]) -> None:
    """Pilot each gate class of ``run_ids`` without a passing pilot (a proposal with another
    width, say); the planned runs of a class whose pilot fails are withdrawn, naming the
    pilot, and the search goes on without them (they keep their line)."""
    from campaign.errors import GateClosed
    from campaign.gates.launch_gate import open_gate
    from campaign.pilot.by_class import pilot_documents

    try:
        open_gate(ledger, campaign, run_ids=run_ids, check_stack=False)
        return
    except GateClosed:
        pass
    url = ledger.engine.url.render_as_string(hide_password=False)
    task = ledger.campaign(campaign).task
    reports = calls.call(pilot_documents, url, campaign, artifacts, device, {}, None, False,
                         task=task, what="piloting a gate class the search proposed")
    failed = {r["gate_class"]: r for r in reports if not r["passed"]}
    if not failed:
        return
    from campaign.gates.classes import run_classes

    for class_id, (_, ids) in run_classes(ledger, campaign, run_ids).items():
        report = failed.get(class_id)
        if report is None:
            continue
        for run_id in ids:
            if ledger.run(run_id).status == "planned":
                ledger.withdraw(run_id, f"search: its gate class {class_id} failed its pilot "
                                f"({report['label']})")


def refuse_undecided(ledger: Ledger, run_id: str) -> None:
    """``campaign resume`` of a run paused at a rung its search has not decided yet: refused
    (resumed now it would wait at once; the decision continues it, or prunes it)."""
    from campaign.errors import LedgerInputError
    from campaign.search.pause import rung_pause

    record = ledger.run(run_id)
    if record.status != "interrupted" or not is_paused({"stop_detail": record.stop_detail}):
        return
    waits_at = rung_pause(ledger, record)
    if waits_at is not None and waits_at <= int(record.stop_step or 0):
        raise LedgerInputError(
            f"run {run_id} waits at rung {waits_at} of its search until every variant of the "
            f"rung reports: `campaign launch {record.campaign}` takes the decision, which "
            "continues or prunes it")
