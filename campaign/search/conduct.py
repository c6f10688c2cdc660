"""The conductor: before each claim, a worker of a search asks it to take the steps that are
due, and which paused runs may continue.

Steps, each written once under its key (campaign/ledger/search_steps.py):

- ``proposals of cohort C``: once the cohorts before it have ended (campaign/search/
  proposals.py); each proposal a variant with its runs on the search seeds.
- ``rung R of cohort C``: once every search run of the cohort's variants still in the
  search is paused at R or ended; one ``search_decision`` event per variant (kept, pruned or
  audit, the rule, the values and the interval it saw, campaign/search/rungs.py); a pruned
  variant's paused runs end ``stopped``/``pruned`` at R, their checkpoint at R kept.
- ``confirmation``: once every cohort is proposed and every search run has ended; the
  ``confirm`` best variants that completed the search (audits left out), and the control,
  are planned again on ``search.confirm_seeds``. The conclusion comes from these alone.

Every answer is a function of results that never change once a step is due, so two workers
that find the same step due write the same step, and one of them is kept.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

from campaign.errors import IllegalTransition, LedgerInputError, SpecError
from campaign.ledger import Ledger
from campaign.ledger.search_steps import Pruning, SearchStep, record_step
from campaign.ledger.vocabulary import paused_at_rung
from campaign.search import rungs as decide_rung
from campaign.search.proposals import propose
from campaign.search.state import (
    CONFIRMATION,
    DECISION,
    PROPOSAL,
    SearchState,
    read_state,
)

MAX_STEPS_PER_LOOK = 100


@dataclass
class Outlook:
    """What a worker of a search may do now."""

    continuing: list[str] = field(default_factory=list)  # paused runs kept past their rung
    finished: bool = False  # every step taken and every run of the search ended
    steps: list[str] = field(default_factory=list)  # steps this look wrote


def advance(ledger: Ledger, campaign: str) -> Outlook | None:
    """Take every step that is due; None when ``campaign`` has no search."""
    outlook = Outlook()
    for _ in range(MAX_STEPS_PER_LOOK):
        state = read_state(ledger, campaign)
        if state is None:
            return None
        step = due_step(state)
        if step is None:
            outlook.continuing = continuing(state)
            outlook.finished = finished(state)
            return outlook
        try:
            if record_step(ledger, campaign, step):
                outlook.steps.append(step.key)
        except IllegalTransition:  # a run left its rung meanwhile: look again
            continue
    raise RuntimeError(f"campaign {campaign!r}: the search took {MAX_STEPS_PER_LOOK} steps in "
                       "one look without settling")


def advance_at(url: str, campaign: str) -> dict[str, Any] | None:
    """:func:`advance` on the ledger at ``url``, as JSON values: what a worker asks a child
    of the task host (pandas and Optuna are imported there, never in the worker)."""
    with Ledger.open(url, ride_out=True) as ledger:
        outlook = advance(ledger, campaign)
    return None if outlook is None else asdict(outlook)


def due_step(state: SearchState) -> SearchStep | None:
    plan = state.plan
    proposed = {int(p["cohort"]) for p in state.proposals}
    for cohort in range(plan.cohorts):
        if plan.proposes and cohort not in proposed:
            if cohort == 0 or cohort_ended(state, cohort - 1):
                return proposals_step(state, cohort)
            break  # later cohorts wait for this one
        if plan.halving:
            step = rung_step(state, cohort)
            if step is not None:
                return step
    if (plan.confirm and "confirmation" not in state.steps
            and (not plan.proposes or len(proposed) == plan.cohorts)
            and all(state.ended(s) for s in state.search_runs()["status"])):
        return confirmation_step(state)
    return None


def cohort_ended(state: SearchState, cohort: int) -> bool:
    names = state.cohort_variants(cohort)
    runs = state.search_runs()
    return all(state.ended(s) for s in runs[runs["variant"].isin(names)]["status"])


def finished(state: SearchState) -> bool:
    plan = state.plan
    if plan.proposes and len({p["cohort"] for p in state.proposals}) < plan.cohorts:
        return False
    if plan.confirm and "confirmation" not in state.steps:
        return False
    return all(state.ended(s) for s in state.runs["status"])


def continuing(state: SearchState) -> list[str]:
    """Paused runs whose variant was kept (or audited) past the rung they wait at."""
    found = []
    for run in state.runs.itertuples():
        if not paused_at_rung(run.status, run.stop_detail):
            continue
        cap = state.pause_step(run.variant, int(run.seed))
        if not state.pruned(run.variant) and (cap is None or cap > int(run.stop_step)):
            found.append(str(run.run_id))
    return found


# -- the steps -----------------------------------------------------------------------


def proposals_step(state: SearchState, cohort: int) -> SearchStep:
    from campaign.plan.grid import relaunch_config

    made = propose(state, cohort)
    control = state.search_runs(state.control).sort_values("seed")
    base = dict(control["config"].iloc[0])
    runs = []
    for proposal in made:
        try:
            config, _ = relaunch_config(base, proposal["params"], state.hold)
        except (SpecError, LedgerInputError) as error:  # a combination the keys' ends passed
            proposal["refused"] = str(error)  # its line, no run: Optuna is told it failed
            continue
        for seed in state.plan.search_seeds:
            runs.append((proposal["variant"], seed, {**config, "seed": seed}))
    return SearchStep(
        key=f"proposals of cohort {cohort}",
        events=[(None, PROPOSAL, json.dumps(p, sort_keys=True)) for p in made],
        variants=[(p["variant"], p["params"]) for p in made], runs=runs)


def rung_step(state: SearchState, cohort: int) -> SearchStep | None:
    """The first rung of ``cohort`` not yet decided, when every run it needs is there."""
    plan = state.plan
    alive = state.cohort_variants(cohort)
    for index, rung in enumerate(plan.rungs):
        key = f"rung {rung} of cohort {cohort}"
        if index:
            before = plan.rungs[index - 1]
            alive = [v for v in alive if any(d["rung"] == before and d["outcome"] == "kept"
                                             for d in state.decisions_of(v))]
        if key in state.steps:
            continue
        if not alive:
            return None
        runs = state.search_runs()
        mine = runs[runs["variant"].isin(alive)]
        if not all(state.paused_at(r, rung) or state.ended(r.status) for r in mine.itertuples()):
            return None
        values = {v: {int(r.seed): state.value(r.run_id, rung)
                      for r in mine[mine["variant"] == v].itertuples()} for v in alive}
        seed = zlib.crc32(f"{plan.seed}:{cohort}:{rung}".encode())
        decided = decide_rung.decide(values, plan.search_seeds, keep=plan.keep, rule=plan.rule,
                                     mode=state.mode, audit=plan.audit, audit_seed=seed)
        events, prune = [], []
        for d in decided:
            detail = {**asdict(d), "rung": rung, "cohort": cohort, "rule": plan.rule,
                      "keep": plan.keep, "alive": len(alive),
                      "values": {str(s): v for s, v in values[d.variant].items()}}
            events.append((None, DECISION, json.dumps(detail, sort_keys=True)))
            if d.outcome == "pruned":
                prune += [Pruning(str(r.run_id), rung, f"search: {d.reason} at rung {rung}")
                          for r in mine[mine["variant"] == d.variant].itertuples()
                          if state.paused_at(r, rung)]
        return SearchStep(key=key, events=events, prune=prune)
    return None


def confirmation_step(state: SearchState) -> SearchStep:
    """The best variants that completed the search, with the control, on fresh seeds."""
    plan = state.plan
    sign = 1.0 if state.mode == "max" else -1.0
    control = {int(r.seed): state.final(r) for r in state.search_runs(state.control).itertuples()}
    estimates: dict[str, dict[str, Any]] = {}
    for variant in dict.fromkeys(state.search_runs()["variant"]):
        if variant == state.control or state.pruned(variant) or state.audited(variant):
            continue
        runs = state.search_runs(variant)
        finals = {int(r.seed): state.final(r) for r in runs.itertuples()}
        if not finals or any(v is None for v in finals.values()):
            continue
        deltas = [finals[s] - control[s] for s in finals  # type: ignore[operator]
                  if control.get(s) is not None]
        estimates[variant] = {
            "mean": sum(finals.values()) / len(finals),  # type: ignore[arg-type]
            "mean_delta": sum(deltas) / len(deltas) if deltas else None,
            "pairs": len(deltas)}
    ranked = sorted(estimates, key=lambda v: (-sign * estimates[v]["mean"], v))
    chosen = ranked[:plan.confirm]
    runs = []
    for variant in [state.control, *chosen]:
        source = state.search_runs(variant).sort_values("seed")
        base = dict(source["config"].iloc[0])
        runs += [(variant, seed, {**base, "seed": seed}) for seed in plan.confirm_seeds]
    detail = {"chosen": chosen, "candidates": len(estimates), "estimates": estimates,
              "seeds": list(plan.confirm_seeds),
              "reason": ("the search's best by mean final value over its seeds" if chosen else
                         "no variant completed the search (every one pruned, audited or "
                         "without a value): only the control is re-run")}
    return SearchStep(key="confirmation",
                      events=[(None, CONFIRMATION, json.dumps(detail, sort_keys=True))],
                      runs=runs)
