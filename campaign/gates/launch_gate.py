"""The launch gate: no run starts on a configuration that no gate has seen.

Every run that could execute (planned, interrupted, lost; or the runs named)
belongs to a gate class (campaign/gates/classes.py). Each class must have a
passing pilot for the frozen spec, its latest one, or someone must have
recorded a decision to skip the pilot (``--skip-pilot --reason``: a
``pilot_skipped`` event, kept forever). The refusal names every class that
is not covered and the command that covers it, before any run starts.
Differences between a pilot's software stack and the launching machine's
are warned about and recorded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from campaign.errors import GateClosed
from campaign.gates.classes import GateClass, gate_class, run_classes
from campaign.gates.rule import gate_state, pilot_decisions, skip_decisions
from campaign.host.calls import with_torch
from campaign.ledger import Ledger, LedgerReader
from campaign.stack.software import environment, stack_differences


@dataclass(frozen=True)
class GateDecision:
    how: str  # "pilot passed", "pilot skipped: <reason>", "nothing to run"
    stack_warnings: tuple[str, ...] = ()


def open_gate(
    ledger: Ledger,
    campaign: str,
    *,
    skip_reason: str | None = None,
    who: str = "launch",
    run_ids: Sequence[str] | None = None,
    check_stack: bool = True,
) -> GateDecision:
    """Check (and record) whether the campaign's runs may start; :class:`GateClosed` naming
    every uncovered gate class otherwise."""
    record = ledger.campaign(campaign)
    classes = run_classes(ledger, campaign, run_ids)
    if skip_reason is not None:
        if not skip_reason.strip():
            raise GateClosed("--skip-pilot needs a --reason")
        covered = [r for _, ids in classes.values() for r in ids]
        # Recorded per run: a run planned later (a relaunch) is not covered by this decision.
        ledger.add_run_events(campaign, "pilot_skipped", f"{who}: {skip_reason.strip()}",
                              covered)
        return GateDecision(f"pilot skipped: {skip_reason.strip()}")
    if not classes:
        return GateDecision("nothing to run")
    pilots, events = ledger.pilots(campaign), ledger.events(campaign)
    skips = skip_decisions(events)
    closed, stacks, skipped = [], [], []
    for class_id, (found, ids) in classes.items():
        decided = pilot_decisions(pilots, events, record.spec_sha256, class_id)
        state = gate_state(decided, [])
        if state.how == "pass":
            stored = state.evidence
            stacks.append(json.loads(stored) if isinstance(stored, str) else stored)
            continue
        states = [gate_state(decided, skips.of(r)) for r in ids]
        uncovered = [r for r, s in zip(ids, states, strict=True) if s.how != "skip"]
        if uncovered:
            closed.append((found, uncovered))
        else:
            skipped.append(str(states[-1].evidence))
    if closed:
        raise GateClosed(_refusal(campaign, closed, len(classes), _control_class(ledger, campaign)))
    if not check_stack:
        return GateDecision("pilot passed" if stacks else "pilot skipped earlier")
    warnings = stack_warnings(ledger, campaign, stacks, who)
    if skipped and not stacks:
        return GateDecision(f"pilot skipped earlier: {skipped[-1]}")
    return GateDecision("pilot passed", warnings)


def passing_stacks(ledger: LedgerReader, campaign: str) -> list[dict[str, object]]:
    """The software stacks of the passing pilots that cover the campaign's runs."""
    record = ledger.campaign(campaign)
    pilots, events = ledger.pilots(campaign), ledger.events(campaign)
    stacks = []
    for class_id in run_classes(ledger, campaign):
        state = gate_state(pilot_decisions(pilots, events, record.spec_sha256, class_id), [])
        if state.how == "pass":
            stored = state.evidence
            stacks.append(json.loads(stored) if isinstance(stored, str) else stored)
    return stacks


def stack_warnings(ledger: Ledger, campaign: str, stacks: Sequence[dict[str, object]] | None,
                   who: str) -> tuple[str, ...]:
    """How this machine's stack differs from the pilots' (``stacks``; None: read them), each
    difference recorded once as a ``stack_difference`` event. Asks torch through the task host
    when this process has none (a worker started by ``launch`` checks it, not the launcher)."""
    record = ledger.campaign(campaign)
    stacks = passing_stacks(ledger, campaign) if stacks is None else stacks
    if not stacks:
        return ()
    here = with_torch(environment, record.task, what="describing the software stack",
                      task=record.task)
    warnings = tuple(dict.fromkeys(w for s in stacks for w in stack_differences(s, here)))
    if warnings:
        detail = f"{who} on a stack unlike the pilot's: " + "; ".join(warnings)
        events = ledger.events(campaign)
        if not ((events["kind"] == "stack_difference") & (events["detail"] == detail)).any():
            ledger.add_event(campaign, "stack_difference", detail)
    return warnings


def _control_class(ledger: LedgerReader, campaign: str) -> GateClass | None:
    runs = ledger.runs(campaign)
    control = runs[runs["is_control"] & runs["relaunch_of"].isna()]
    return gate_class(control["config"].iloc[0]) if len(control) else None


def _refusal(campaign: str, closed: list[tuple[GateClass, list[str]]], total: int,
             control: GateClass | None) -> str:
    if total == 1 and len(closed) == 1:
        return (f"campaign {campaign!r} has no passing pilot for its frozen spec (gate class "
                f"{closed[0][0].id}): run `campaign pilot {campaign}` first, or launch with "
                "--skip-pilot --reason TEXT")
    named = "; ".join(
        f"gate class {found.id} ({found.describe(control)}): {len(ids)} "
        f"run{'s' * (len(ids) > 1)}" for found, ids in closed[:3])
    return (f"campaign {campaign!r}: {len(closed)} of {total} gate classes have no passing "
            f"pilot ({named}): run `campaign pilot {campaign}` (it pilots every class not yet "
            f"covered; `--class ID` for one), or launch with --skip-pilot --reason TEXT")


def pilot_passed(ledger: LedgerReader, campaign: str) -> bool:
    """True when every gate class that could run has a passing pilot (its latest one)."""
    record = ledger.campaign(campaign)
    pilots, events = ledger.pilots(campaign), ledger.events(campaign)
    classes = run_classes(ledger, campaign) or {None: None}
    for class_id in classes:
        decided = pilot_decisions(pilots, events, record.spec_sha256, class_id)
        if gate_state(decided, []).how != "pass":
            return False
    return True
