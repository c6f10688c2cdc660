"""One pilot per gate class: every configuration that will run is seen by a gate first.

A campaign whose variants differ only in learning rate has one class and one
pilot; a variant with a wider model, or a relaunch with another
``max_length``, adds a class (campaign/gates/classes.py). ``campaign pilot C``
pilots every class that could run and has no passing pilot yet; ``--class``
picks one (piloted again even when covered); ``--all`` re-pilots them all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from campaign.gates.classes import GateClass, run_classes
from campaign.gates.rule import gate_state, pilot_decisions
from campaign.ledger import Ledger, LedgerInputError
from campaign.pilot.phase_gates import PilotOptions, PilotReport, run_pilot
from campaign.plan.grid import current_pilot_table
from campaign.stack.devices import refuse_missing_device


def classes_to_pilot(
    ledger: Ledger, campaign: str, *, only: str | None = None, every: bool = False
) -> list[tuple[GateClass, list[str]]]:
    """The classes ``campaign pilot`` would pilot, each with its run ids."""
    record = ledger.campaign(campaign)
    executable = run_classes(ledger, campaign)
    if not executable:  # nothing left to run: pilot the plan as a whole, by class
        runs = ledger.runs(campaign)
        executable = run_classes(ledger, campaign, list(runs[runs["status"] != "withdrawn"][
            "run_id"]))
    if not executable:
        raise LedgerInputError(f"campaign {campaign!r} has no run that will execute (every run "
                               "is withdrawn): nothing to pilot")
    if only is not None:
        matches = [c for c in executable if c.startswith(only)]
        if len(matches) != 1:
            known = ", ".join(executable) or "none"
            raise LedgerInputError(f"--class {only!r}: {'no' if not matches else 'more than one'} "
                                   f"gate class of {campaign!r} matches (classes: {known})")
        return [executable[matches[0]]]
    if every:
        return list(executable.values())
    pilots, events = ledger.pilots(campaign), ledger.events(campaign)
    return [(found, ids) for class_id, (found, ids) in executable.items()
            if gate_state(pilot_decisions(pilots, events, record.spec_sha256, class_id), []).how
            != "pass"]


def pilot_classes(
    ledger: Ledger,
    campaign: str,
    *,
    artifacts: Path,
    device: str = "cpu",
    overrides: dict[str, Any] | None = None,
    only: str | None = None,
    every: bool = False,
) -> list[tuple[GateClass, PilotReport]]:
    """Pilot each class of :func:`classes_to_pilot` on its run closest to the control, with
    the spec's ``[pilot]`` criterion (``overrides``: the command line's, where given)."""
    refuse_missing_device(device)  # also when no class needs a pilot: never a silent yes
    table = current_pilot_table(ledger, campaign)  # a re-plan may have changed only [pilot]
    options = PilotOptions.from_spec({"pilot": table}, **(overrides or {}))
    runs = ledger.runs(campaign).set_index("run_id", drop=False)
    reports = []
    for found, ids in classes_to_pilot(ledger, campaign, only=only, every=every):
        mine = runs.loc[ids]
        ordered = mine.sort_values(["is_control", "seed"], ascending=[False, True])
        chosen: dict[str, Any] = ordered.iloc[0].to_dict()
        report = run_pilot(ledger, campaign, artifacts=artifacts, device=device,
                           options=options, run=chosen,
                           gate_class=found.id)
        reports.append((found, report))
    return reports


def pilot_documents(url: str, campaign: str, artifacts: str, device: str,
                    overrides: dict[str, Any], only: str | None,
                    every: bool) -> list[dict[str, Any]]:
    """:func:`pilot_classes` on the ledger at ``url``, as JSON values: what ``campaign pilot``
    runs in a child of the task host (the command imports no torch)."""
    with Ledger.open(url) as ledger:
        reports = pilot_classes(ledger, campaign, artifacts=Path(artifacts), device=device,
                                overrides=overrides, only=only, every=every)
    return [
        {"pilot_id": report.pilot_id, "number": report.number, "label": report.label,
         "gate_class": found.id, "variant": report.variant,
         "passed": report.passed,
         "phases": [{"gate_class": found.id, "phase": r.phase, "verdict": r.verdict,
                     "duration_s": None if r.duration_s is None else round(r.duration_s, 4),
                     "allocated_peak": r.allocated_peak, "reserved_peak": r.reserved_peak,
                     "rss_peak": r.rss_peak, "detail": r.detail} for r in report.records]}
        for found, report in reports
    ]
