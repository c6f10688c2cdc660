"""What the ledger holds of a search, read once per look: its plan (the frozen spec's
``[search]``), its variants and runs by role, the metric at each rung, and the steps taken
(decisions, proposals, confirmation), each an event written once (campaign/ledger/
search_steps.py). Everything the conductor decides is a function of this alone.

Roles: a run whose seed is one of ``grid.seeds`` is a search run, one whose seed is one of
``search.confirm_seeds`` a confirmation run; relaunches are neither (a later look at a pruned
variant is a relaunch, docs/runs.md). A variant with an ``audit`` decision is an audit
variant: its runs continue to the full budget and count in no conclusion.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from campaign.ledger import LedgerReader
from campaign.ledger.vocabulary import TERMINAL_STATUSES, paused_at_rung
from campaign.plan.search_spec import SearchPlan, search_plan

DECISION = "search_decision"
PROPOSAL = "search_proposal"
CONFIRMATION = "search_confirmation"
RELAUNCHED = "relaunched"  # (the search's own word) an unended original that was relaunched
STEP = "search_step"


@dataclass
class SearchState:
    name: str
    plan: SearchPlan
    metric: str
    mode: str
    control: str
    hold: dict[str, Any]
    runs: pd.DataFrame  # original runs: run_id, variant, seed, status, stop_*, config
    values: dict[tuple[str, int], float]  # (run id, step) -> the metric (latest segment)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    proposals: list[dict[str, Any]] = field(default_factory=list)
    confirmation: dict[str, Any] | None = None
    steps: set[str] = field(default_factory=set)
    spec: dict[str, Any] = field(default_factory=dict)  # the frozen spec document

    # -- roles ----------------------------------------------------------------------

    def search_runs(self, variant: str | None = None) -> pd.DataFrame:
        runs = self.runs[self.runs["seed"].isin(self.plan.search_seeds)]
        return runs if variant is None else runs[runs["variant"] == variant]

    def confirm_runs(self) -> pd.DataFrame:
        return self.runs[self.runs["seed"].isin(self.plan.confirm_seeds)]

    def cohort_of(self, variant: str) -> int:
        for proposal in self.proposals:
            if proposal["variant"] == variant:
                return int(proposal["cohort"])
        return 0  # the grid's own variants are compared with the first cohort

    def cohort_variants(self, cohort: int) -> list[str]:
        names = list(dict.fromkeys(self.search_runs()["variant"]))
        return [v for v in names if v != self.control and self.cohort_of(v) == cohort]

    def decisions_of(self, variant: str) -> list[dict[str, Any]]:
        return sorted((d for d in self.decisions if d["variant"] == variant),
                      key=lambda d: d["rung"])

    def audited(self, variant: str) -> bool:
        return any(d["outcome"] == "audit" for d in self.decisions_of(variant))

    def pruned(self, variant: str) -> bool:
        return any(d["outcome"] == "pruned" for d in self.decisions_of(variant))

    def pause_step(self, variant: str, seed: int) -> int | None:
        """The rung at which this variant's search run waits next; None: to the end."""
        return pause_step(self.plan, self.decisions_of(variant), variant == self.control, seed)

    # -- progress -------------------------------------------------------------------

    @staticmethod
    def ended(status: str) -> bool:
        return status in TERMINAL_STATUSES or status == RELAUNCHED

    def paused_at(self, run: Any, rung: int) -> bool:
        return paused_at_rung(run.status, run.stop_detail) and int(run.stop_step) == rung

    def value(self, run_id: str, step: int) -> float | None:
        return self.values.get((run_id, step))

    def final(self, run: Any) -> float | None:
        """A run's value at its budget (completed only: a pruned run's last value is not)."""
        if run.status != "completed":
            return None
        return self.value(run.run_id, int(run.config["budget"]["updates"]))


def pause_step(plan: SearchPlan, decided: list[dict[str, Any]], is_control: bool,
               seed: int) -> int | None:
    """Where a search run of a variant with these decisions waits next (None: it runs to its
    budget): the control, confirmation runs and audited variants never wait."""
    if not plan.halving or is_control or seed not in plan.search_seeds:
        return None
    if any(d["outcome"] == "audit" for d in decided):
        return None
    kept = sum(d["outcome"] == "kept" for d in decided)
    return plan.rungs[kept] if kept < len(plan.rungs) else None


def read_state(ledger: LedgerReader, campaign: str) -> SearchState | None:
    """The search of ``campaign`` as the ledger holds it; None when it has no search."""
    record = ledger.campaign(campaign)
    spec = record.spec_document
    plan = search_plan(spec)
    if plan is None:
        return None
    # Events first: a step's event commits with its runs, and a run's metrics before its
    # end, so what is read next holds everything the events name (reads are separate
    # queries: in the other order a step committed between them tears the view, and a
    # cohort whose runs are not read yet looks ended).
    events = ledger.events(campaign)
    every = ledger.runs(campaign)
    runs = every[every["relaunch_of"].isna()].copy()
    # An original that was relaunched before it ended (a resume refused for good) is out of
    # the search: its seed has no value, and nothing waits on it any more.
    gone = runs["run_id"].isin(every["relaunch_of"]) & ~runs["status"].isin(TERMINAL_STATUSES)
    runs.loc[gone, "status"] = RELAUNCHED
    runs["seed"] = runs["seed"].astype(int)
    control = str(runs[runs["is_control"].astype(bool)]["variant"].iloc[0])
    metric = spec["validation"]["metric"]
    points = ledger.metrics(campaign, keys=[metric])
    values = {(str(r.run_id), int(r.step)): float(r.value)
              for r in points.itertuples() if pd.notna(r.value)}
    state = SearchState(record.name, plan, metric, spec["validation"]["mode"], control,
                        dict(spec.get("hold") or {}), runs.reset_index(drop=True), values,
                        spec=spec)
    for row in events[events["run_id"].isna()].itertuples():
        if row.kind == STEP:
            state.steps.add(str(row.detail))
        elif row.kind == DECISION:
            state.decisions.append(json.loads(row.detail))
        elif row.kind == PROPOSAL:
            state.proposals.append(json.loads(row.detail))
        elif row.kind == CONFIRMATION:
            state.confirmation = json.loads(row.detail)
    return state
