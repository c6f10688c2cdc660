"""The launch gate: no real money is spent before a pilot crossed every phase.

A campaign may launch when its latest pilot for the frozen spec passed, or
when someone recorded a decision to skip it (``--skip-pilot --reason``: a
``pilot_skipped`` event, kept forever). Differences between the pilot's
software stack and the launching machine's are warned about and recorded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from campaign.gate_rule import gate_inputs, gate_state
from campaign.ledger import Ledger, LedgerReader
from campaign.stack import environment, stack_differences


class GateClosed(Exception):
    """The campaign has no passing pilot and nobody recorded a decision to skip it."""


@dataclass(frozen=True)
class GateDecision:
    how: str  # "pilot passed" or "pilot skipped: <reason>"
    stack_warnings: tuple[str, ...] = ()


def open_gate(
    ledger: Ledger, campaign: str, *, skip_reason: str | None = None, who: str = "launch"
) -> GateDecision:
    """Check (and record) whether ``campaign`` may launch; :class:`GateClosed` otherwise."""
    record = ledger.campaign(campaign)
    if skip_reason is not None:
        if not skip_reason.strip():
            raise GateClosed("--skip-pilot needs a --reason")
        ledger.add_event(campaign, "pilot_skipped", f"{who}: {skip_reason.strip()}")
        return GateDecision(f"pilot skipped: {skip_reason.strip()}")
    state = gate_state(*gate_inputs(ledger.pilots(campaign), ledger.events(campaign),
                                    record.spec_sha256))  # fmt: skip
    if state.how == "pass":
        stored = state.evidence
        pilot_stack = json.loads(stored) if isinstance(stored, str) else stored
        warnings = tuple(stack_differences(pilot_stack, environment(record.task)))
        if warnings:
            ledger.add_event(
                campaign, "stack_difference", f"{who} on a stack unlike the pilot's: "
                + "; ".join(warnings),
            )  # fmt: skip
        return GateDecision("pilot passed", warnings)
    if state.how == "skip":
        return GateDecision(f"pilot skipped earlier: {state.evidence}")
    raise GateClosed(
        f"campaign {campaign!r} has no passing pilot for its frozen spec: run "
        f"`campaign pilot {campaign}` first, or launch with --skip-pilot --reason TEXT"
    )


def pilot_passed(ledger: LedgerReader, campaign: str) -> bool:
    """True when the latest pilot for the campaign's frozen spec passed."""
    pilots = ledger.pilots(campaign)
    spec_hash = ledger.campaign(campaign).spec_sha256
    mine = pilots[pilots["config_sha256"] == spec_hash]
    return bool(len(mine)) and mine["verdict"].iloc[-1] == "pass"
