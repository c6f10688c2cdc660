"""Where a search's run pauses: the worker asks once per segment and gives the loop the
step (``RunLoop(pause_at=...)``, campaign/launch/run_body.py).

At the rung, after its validation, the run checkpoints and ends ``interrupted`` with the
cause ``preempted`` (the search's scheduler takes its slot back) and a detail that starts
with "search: paused at rung": a worker resumes it only once the rung's decision kept it
(campaign/search/conduct.py), and a pruned one is ended ``stopped``/``pruned`` there.
"""

from __future__ import annotations

import json

from campaign.ledger import LedgerReader
from campaign.ledger.records import RunRecord
from campaign.plan.search_spec import search_plan
from campaign.search.state import DECISION, pause_step


def rung_pause(ledger: LedgerReader, record: RunRecord) -> int | None:
    """The rung at which ``record`` pauses next, or None (no search, or to its budget)."""
    if record.relaunch_of is not None:
        return None
    plan = search_plan(ledger.campaign(record.campaign).spec_document)
    if plan is None or not plan.halving or record.seed not in plan.search_seeds:
        return None
    events = ledger.events(record.campaign)
    decided = [json.loads(d) for d in events[(events["kind"] == DECISION)
                                             & events["run_id"].isna()]["detail"]]
    mine = [d for d in decided if d["variant"] == record.variant]
    runs = ledger.runs(record.campaign)
    is_control = bool(runs[runs["run_id"] == record.id]["is_control"].iloc[0])
    return pause_step(plan, mine, is_control, int(record.seed))
