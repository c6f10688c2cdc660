"""Plan small real campaigns for the loop tests (digits and arithmetic, a few dozen updates)."""

from __future__ import annotations

import copy
from typing import Any

from campaign.ledger import Ledger
from campaign.plan.grid import make_plan, record_plan
from campaign.plan.spec import resolve_spec

BASE: dict[str, Any] = {
    "campaign": {"name": "loop", "question": "does the loop work?",
                 "task": "campaign.tasks.digits:build"},
    "hold": {"loop.microbatch": 4, "loop.accumulation": 2, "budget.updates": 12},
    "config": {"optimizer.name": "adamw", "optimizer.lr": 1e-2, "task.limit": 300},
    "validation": {"every": 4, "metric": "val/accuracy", "mode": "max"},
    "stop": {"loss_explosion": 4.0},
    "grid": {"seeds": [0], "control": "only", "variants": [{"name": "only"}]},
}


def plan_loop(
    ledger: Ledger,
    name: str = "loop",
    *,
    task: str | None = None,
    hold: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    stop: dict[str, Any] | None = None,
    validation: dict[str, Any] | None = None,
    seeds: list[int] | None = None,
) -> list[str]:
    """Plan ``BASE`` with the given sections merged in; returns the run ids."""
    spec = copy.deepcopy(BASE)
    spec["campaign"]["name"] = name
    if task:
        spec["campaign"]["task"] = task
    spec["hold"].update(hold or {})
    spec["config"].update(config or {})
    spec["stop"].update(stop or {})
    spec["validation"].update(validation or {})
    if seeds is not None:
        spec["grid"]["seeds"] = seeds
    for key in list(spec["config"]):
        if key in spec["hold"]:
            del spec["config"][key]
    record, _ = record_plan(ledger, make_plan(resolve_spec(spec, f"<{name}>")))
    return list(record.run_ids)


def plan_quick(
    ledger: Ledger,
    name: str,
    *,
    runs: int,
    updates: int = 4,
    task: dict[str, Any] | None = None,
    hold: dict[str, Any] | None = None,
    validation_every: int | None = None,
) -> list[str]:
    """``runs`` runs (one variant, one seed each) of the quick task; returns the run ids."""
    every = validation_every or updates
    return plan_loop(
        ledger,
        name,
        task="tests.support.tasks.quick:build",
        hold={"loop.microbatch": 4, "loop.accumulation": 2, "budget.updates": updates,
              **(hold or {})},
        config={"optimizer.lr": 0.1, "optimizer.name": "sgd",
                **{f"task.{k}": v for k, v in (task or {}).items()}},
        validation={"every": every},
        seeds=list(range(runs)),
    )


def forward_calls(module: Any) -> list[int]:
    """A live count of ``module``'s forward calls (a forward hook). Inside a block under
    activation checkpointing a module runs twice per forward-backward (the recompute), once
    without: equal gradients alone would also hold if checkpointing did nothing."""
    calls = [0]

    def count(*_: Any) -> None:
        calls[0] += 1

    module.register_forward_hook(count)
    return calls
