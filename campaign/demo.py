"""The main job on the embedded default: plan, inspect, pilot, launch and report one campaign.

The three-learning-rate campaign of docs/spec.md on the built-in digits
task (control 1e-4, variants 5e-5 and 2e-4; effective batch 16; 200 updates;
three seeds, so that every conclusion has its 95% interval) plus one honestly
aggressive variant (learning rate 3.0) that really diverges, so the balance
sheet shows what a diverged run looks like.
Everything lands in one folder: the SQLite ledger, the artifacts, the report.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from campaign.gates.launch_gate import open_gate
from campaign.launch.live_table import ProgressDisplay
from campaign.launch.local import LocalLauncher, plan_slots
from campaign.launch.worker import WorkerOptions
from campaign.ledger import Ledger
from campaign.ledger.progress import Snapshot
from campaign.loop.run_files import artifacts_environment
from campaign.pilot.by_class import pilot_classes
from campaign.pilot.inspect_hosted import inspect_campaign
from campaign.plan.grid import make_plan, record_plan
from campaign.plan.spec import resolve_spec
from campaign.report.balance import balance_sheet
from campaign.report.render import write

NAME = "digits-lr"
SPEC: dict[str, Any] = {
    "campaign": {"name": NAME, "task": "campaign.tasks.digits:build",
                 "question": "Which learning rate gives the best validation accuracy after "
                             "200 updates?"},
    "hold": {"loop.microbatch": 2, "loop.accumulation": 8, "loop.replicas": 1,
             "loop.precision": "fp32", "budget.updates": 200},
    "config": {"optimizer.name": "adamw", "optimizer.lr": 1e-4, "optimizer.weight_decay": 0.01},
    "validation": {"every": 25, "metric": "val/accuracy", "mode": "max"},
    "stop": {"loss_explosion": 4.0, "patience": 0, "wall_time": "30m"},
    "grid": {"seeds": [0, 1, 2], "control": "lr-1e-4", "variants": [
        {"name": "lr-1e-4", "set": {"optimizer.lr": 1e-4}},
        {"name": "lr-5e-5", "set": {"optimizer.lr": 5e-5}},
        {"name": "lr-2e-4", "set": {"optimizer.lr": 2e-4}},
        {"name": "lr-3e0", "set": {"optimizer.lr": 3.0}},  # diverges, on purpose
    ]},
}


@dataclass(frozen=True)
class DemoResult:
    folder: Path
    ledger_url: str
    report: Path
    snapshot: Snapshot
    pilot_passed: bool


def spec(updates: int = 200, seeds: int = 3) -> dict[str, Any]:
    document = copy.deepcopy(SPEC)
    document["hold"]["budget.updates"] = updates
    document["validation"]["every"] = max(1, min(25, updates // 4))
    document["grid"]["seeds"] = list(range(seeds))
    return document


def run_demo(
    folder: Path,
    *,
    updates: int = 200,
    seeds: int = 3,
    workers: int = 2,
    say: Callable[[str], None] = print,
    llm: bool = False,
) -> DemoResult:
    """Plan, inspect, pilot, launch and report the demo campaign in ``folder`` (``llm``: the
    instruction fine-tuning campaign of :mod:`campaign.demo_llm` instead of digits)."""
    folder.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{(folder / 'campaign.db').resolve()}"
    artifacts = folder / "artifacts"
    if llm:
        from campaign import demo_llm

        name, document = demo_llm.NAME, demo_llm.spec(folder, updates, seeds)
    else:
        name, document = NAME, spec(updates, seeds)
    with Ledger.open(url, create=True) as ledger:
        record, created = record_plan(ledger, make_plan(resolve_spec(document, "<demo>")))
        say(f"planned {record.name!r}: {len(record.run_ids)} runs"
            + ("" if created else " (already planned here)"))
        with artifacts_environment(artifacts):  # a task's cache (a tokenizer) goes there
            inspection = inspect_campaign(ledger, name, "train", 0)
        say(f"inspect: data gate {'passed' if inspection['passed'] else 'FAILED'} "
            f"({len(inspection['data_gate'])} checks)")
        reports = pilot_classes(ledger, name, artifacts=artifacts, device="cpu")  # pilots/...
        for found, pilot in reports:
            say(f"{pilot.label} of gate class {found.id}: "
                f"{'passed' if pilot.passed else 'FAILED'} (on {pilot.variant})")
        if not reports:
            say("pilot: every gate class already has a passing pilot")
        passed = all(pilot.passed for _, pilot in reports)
        if passed:
            open_gate(ledger, name, who="demo")
        else:
            open_gate(ledger, name, skip_reason="demo: the pilot failed, launching to show it",
                      who="demo")
        options = WorkerOptions(name, artifacts, replay_in_subprocess=True)
        launcher = LocalLauncher(url, options, plan_slots("cpu", workers),
                                 display=ProgressDisplay())
        result = launcher.run(ledger)
        sheet = balance_sheet(ledger, name)
        report = write(sheet, "html", folder / f"{name}-report.html")
    say(f"conclusion: {sheet.conclusion}")
    say(f"ledger:    {url}")
    say(f"artifacts: {artifacts}")
    say(f"report:    {report}")
    return DemoResult(folder, url, report, result.snapshot, passed)
