"""A worker's part in a search (docs/search.md): before each claim it asks the conductor to
take the steps that are due, continues the paused runs a rung's decision kept, pilots a gate
class a proposal brought before any of its runs trains, and waits while the search still
depends on runs other workers are running.

The conductor and the pilot run in children of the task host (pandas, Optuna and torch are
imported there): the worker process imports none of them.
"""

from __future__ import annotations

import time
from typing import Any

from campaign.host import calls
from campaign.ledger import Ledger
from campaign.ledger.vocabulary import paused_at_rung
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


def _piloting(ledger: Ledger, campaign: str, since: float) -> bool:
    """Whether the latest round's pilot is still to come or without a verdict: no pilot
    row created since the round began, or one without its verdict yet."""
    pilots = ledger.pilots(campaign)
    if pilots.empty:
        return True
    began = ledger.database_now().timestamp() - since
    mine = pilots[pilots["created_at"].map(lambda t: t.timestamp()) >= began - 1.0]
    return mine.empty or bool(mine["verdict"].isna().any())


def is_paused(row: dict[str, Any]) -> bool:
    """A run paused at a rung: only the rung's decision continues it (never a plain resume)."""
    return paused_at_rung(row.get("status", "interrupted"), row.get("stop_detail"))


PILOT_WAIT_S = 600.0  # a pilot round without a verdict for this long is taken as dead
PILOT_ROUND = "pilot round"  # the search step that elects the worker who pilots new classes


def _rounds(ledger: Ledger, campaign: str) -> tuple[int, float | None]:
    """(pilot rounds taken, seconds since the latest) from the search's step events."""
    events = ledger.events(campaign)
    taken = events[(events["kind"] == "search_step")
                   & events["detail"].str.startswith(PILOT_ROUND, na=False)]
    if taken.empty:
        return 0, None
    latest = taken["at"].max().to_pydatetime()
    return len(taken), (ledger.database_now() - latest).total_seconds()


def pilot_new_classes(ledger: Ledger, campaign: str, artifacts: str, device: str,
                      run_ids: list[str]) -> None:
    """Pilot each gate class of ``run_ids`` without a passing pilot (a proposal with another
    width, say); the planned runs of a class whose pilot fails are withdrawn, naming the
    pilot, and the search goes on without them (they keep their line).

    One worker pilots: the one that writes the next ``pilot round`` step (written once, as
    every search step); the others wait for its verdicts, and take the next round only when
    one stays without a verdict past ``PILOT_WAIT_S`` (its worker died)."""
    from campaign.errors import GateClosed
    from campaign.gates.launch_gate import open_gate
    from campaign.ledger.search_steps import SearchStep, record_step
    from campaign.pilot.by_class import pilot_documents

    while True:
        try:
            open_gate(ledger, campaign, run_ids=run_ids, check_stack=False)
            return
        except GateClosed:
            pass
        rounds, since = _rounds(ledger, campaign)
        if since is not None and since < PILOT_WAIT_S and _piloting(ledger, campaign, since):
            time.sleep(1.0)  # another worker's round is under way: its verdicts, not ours
            continue
        if record_step(ledger, campaign, SearchStep(key=f"{PILOT_ROUND} {rounds + 1}")):
            break
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
