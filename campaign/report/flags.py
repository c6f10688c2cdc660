"""Integrity flags: what a reader must know before trusting a run's number (docs/report.md).

Each flag is (run, kind, evidence). A flagged run keeps its line and its
value; the flag says why the value may not mean what it seems:

- ``replay_differs``: the final artifact, reloaded in a fresh process, gave
  other outputs than the run recorded (or the replay itself failed);
- ``replay_interrupted``: the run's replay check was killed (twice) by a signal nobody of
  ours sent, so it says nothing either way; a later ``campaign replay`` whose outputs are
  identical clears it, as it clears a replay that failed (a replay that gave other outputs
  stays flagged: it is evidence of a difference; the earlier events stay in the ledger);
- ``determinism_differs``: steps replayed after a resume gave other losses;
- ``pilot_skipped``: the run started under a recorded decision to skip the
  pilot (the reason is the evidence);
- ``ungated``: the run started with neither a passing pilot nor a recorded skip;
- ``stack_differs``: the run's software stack is not the passing pilot's;
- ``held_deviation``: the run's config changes a held key;
- ``changes_variant_key``: a relaunch changes a key that defines the variants;
- ``budget_not_reached``: the run ended normally before its planned updates (a search's
  pruned run is not flagged: its decision is recorded);
- ``budget_exceeded``: the run did more updates than planned (a resume past its budget,
  before the loop refused it): its value is not counted, the seed counts as without one;
- ``base_differs``: an adapter run trained on another frozen base or tokenizer than its
  variant's first run (a tokenizer folder replaced between two runs): its seeds are not
  one experiment.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from campaign.gates.classes import gate_class
from campaign.gates.rule import gate_state, pilot_decisions, skip_decisions
from campaign.plan.config_keys import config_value, held_deviations
from campaign.stack.software import stack_differences

KINDS = ("replay_differs", "replay_interrupted", "determinism_differs", "pilot_skipped",
         "ungated", "stack_differs", "held_deviation", "changes_variant_key", "budget_not_reached",
         "budget_exceeded", "base_differs")
COLUMNS = ("run_id", "kind", "detail")
ADAPTER_FACTS = {"lora", "adapter_init"}  # in a base_model event, of the adapter: per seed


def integrity_flags(
    runs: pd.DataFrame,
    events: pd.DataFrame,
    pilots: pd.DataFrame,
    spec_sha256: str,
    hold: dict[str, Any],
    relaunches: pd.DataFrame,
) -> pd.DataFrame:
    """Every flag of every run, in run order then kind order. ``runs`` is the run table plus
    ``config``, ``environment`` and ``started_at``."""
    found: list[dict[str, Any]] = []
    found += event_flags(events)
    found += _gate_flags(runs, events, pilots, spec_sha256)
    found += base_flags(runs, events)
    for row in runs.itertuples():
        for key in held_deviations(row.config, hold):
            detail = f"{key} is {config_value(row.config, key)!r}, held at {hold[key]!r}"
            found.append(_flag(row.run_id, "held_deviation", detail + " by the spec"))
        if (row.status in ("completed", "stopped") and row.updates_planned
                and row.updates_done < row.updates_planned
                and row.stop_cause != "pruned"):  # a search's recorded decision: no surprise
            found.append(_flag(row.run_id, "budget_not_reached",
                               f"{row.status} at update {row.updates_done} of "
                               f"{row.updates_planned} ({row.stop_cause})"))
        if exceeds_budget(row):
            found.append(_flag(row.run_id, "budget_exceeded",
                               f"{row.updates_done} updates done of {row.updates_planned} "
                               "planned: the budget is a held key, this value is not "
                               "counted"))
    for row in relaunches.itertuples():
        for key in row.changes_variant_key:
            before, after = row.changes[key]
            found.append(_flag(row.run_id, "changes_variant_key",
                               f"{key} {before!r} -> {after!r}: the key that tells the variants "
                               f"apart; this run is no longer a run of {row.variant}"))
    order = {run_id: i for i, run_id in enumerate(runs["run_id"])}
    found.sort(key=lambda f: (order.get(f["run_id"], len(order)), KINDS.index(f["kind"])))
    return pd.DataFrame(found, columns=list(COLUMNS))


def exceeds_budget(row: Any) -> bool:
    """More updates done than planned (a run recorded through the API may plan none)."""
    return bool(row.updates_planned) and row.updates_done > row.updates_planned


def _flag(run_id: str, kind: str, detail: str) -> dict[str, Any]:
    return {"run_id": run_id, "kind": kind, "detail": detail}


def event_flags(events: pd.DataFrame) -> list[dict[str, Any]]:
    """The flags a run's own events raise: a replay that differed or could not run, a
    determinism check after a resume that found other losses."""
    found = []
    for row in events[events["run_id"].notna()].itertuples():
        detail = str(row.detail or "")
        if row.kind == "replay" and "was interrupted" in detail:
            if not _replayed_identically_after(events, row.run_id, row.id):
                found.append(_flag(row.run_id, "replay_interrupted", detail))
        elif row.kind == "replay" and "DIFFERENT" in detail:
            found.append(_flag(row.run_id, "replay_differs", detail))
        elif row.kind == "replay" and "failed" in detail:
            if not _replayed_identically_after(events, row.run_id, row.id):
                found.append(_flag(row.run_id, "replay_differs", detail))
        elif row.kind == "determinism_check" and "(identical)" not in detail:
            found.append(_flag(row.run_id, "determinism_differs", detail))
    return found


def _replayed_identically_after(events: pd.DataFrame, run_id: str, event_id: int) -> bool:
    """A ``campaign replay`` of the ended run after event ``event_id`` whose outputs were
    identical (its campaign-level ``replay`` event names the run: an ended run takes no rows)."""
    later = events[(events["kind"] == "replay") & (events["id"] > event_id)]
    prefix = f"run {run_id}: "
    return any(str(d).startswith(prefix) and "outputs identical" in str(d)
               for d in later["detail"])


def base_flags(runs: pd.DataFrame, events: pd.DataFrame) -> list[dict[str, Any]]:
    """``base_differs``: each adapter run's base (its first ``base_model`` event: the frozen
    weights' hash, the tokenizer, the base's source) against its variant's first run's."""
    bases = events[(events["kind"] == "base_model") & events["run_id"].notna()]
    first: dict[str, dict[str, Any]] = {}
    for run_id, detail in zip(bases["run_id"], bases["detail"], strict=True):
        first.setdefault(run_id, _identity(detail))  # events in order: the run's first
    found, reference = [], {}
    for row in runs.itertuples():
        mine = first.get(row.run_id)
        if mine is None:
            continue
        if row.variant not in reference:
            reference[row.variant] = (row.run_id, mine)
            continue
        origin, theirs = reference[row.variant]
        keys = sorted((set(mine) | set(theirs)) - ADAPTER_FACTS)  # the base, not the adapter
        apart = [f"{key}: {mine.get(key)!r} here, {theirs.get(key)!r} for run {origin}"
                 for key in keys if mine.get(key) != theirs.get(key)]
        if apart:
            found.append(_flag(row.run_id, "base_differs", "; ".join(apart)))
    return found


def _identity(detail: Any) -> dict[str, Any]:
    try:
        found = json.loads(str(detail))
    except ValueError:
        return {"base_model": str(detail)}
    return found if isinstance(found, dict) else {"base_model": found}


def _gate_flags(
    runs: pd.DataFrame, events: pd.DataFrame, pilots: pd.DataFrame, spec_sha256: str
) -> list[dict[str, Any]]:
    """How each started run got through the pilot gate: the launch's rule
    (:mod:`campaign.gates.rule`) applied at the run's start, to its own gate class."""
    inputs: dict[str, Any] = {}  # per gate class: one pilot speaks for its own class
    skips = skip_decisions(events)
    found = []
    for row in runs[runs["started_at"].notna()].itertuples():
        class_id = gate_class(row.config).id
        if class_id not in inputs:
            inputs[class_id] = pilot_decisions(pilots, events, spec_sha256, class_id)
        state = gate_state(inputs[class_id], skips.of(row.run_id), row.started_at)
        if state.how == "closed":
            found.append(_flag(row.run_id, "ungated",
                               "started with no passing pilot and no recorded skip"))
        elif state.how == "skip":
            found.append(_flag(row.run_id, "pilot_skipped", f"pilot skipped: {state.evidence}"))
        elif isinstance(row.environment, dict) and row.environment:
            stack = state.evidence if isinstance(state.evidence, dict) else None
            differences = stack_differences(stack, row.environment)
            if differences:
                found.append(_flag(row.run_id, "stack_differs", "; ".join(differences)))
    return found


def campaign_flags(ledger: Any, campaign: str) -> pd.DataFrame:
    """The flags of ``campaign`` without reading any metric (for ``campaign runs``): a
    finished run's updates done are its stop step."""
    from campaign.report.relaunches import defining_keys, relaunch_table

    record = ledger.campaign(campaign)
    runs = ledger.runs(campaign)
    budgets = [c.get("budget") or {} for c in runs["config"]]
    table = runs.assign(
        updates_planned=[int(b.get("updates") or 0) for b in budgets],
        updates_done=runs["stop_step"].fillna(0).astype(int),
    )
    hold = record.spec_document.get("hold", {})
    relaunches = relaunch_table(runs, {}, defining_keys(runs))
    return integrity_flags(table, ledger.events(campaign), ledger.pilots(campaign),
                           record.spec_sha256, hold, relaunches)
