"""What planning asks the task, in the task host's child: kept apart from the planner and the
ledger (SQLAlchemy, pydantic's spec schema: 0.3 s), which the child of ``plan`` never needs,
so the task's answers come as soon as torch and the task are imported (docs/cli.md, plan)."""

from __future__ import annotations

import copy
from typing import Any

from campaign.ledger.canonical import canonical_json
from campaign.loop.taskref import TaskReferenceError, load_factory


def task_facts(task: str, control: dict[str, Any], configs: list[dict[str, Any]],
               variants: list[str] | None = None) -> dict[str, Any]:
    """Everything planning asks the task, in one guarded child (the user's module is imported
    once, not once per question): whether the reference imports (``reference``: the problem
    or None), the training-set size per task config (``sizes``: canonical task config -> int,
    or why it cannot tell), whether the control's config builds a task that keeps the
    contract and passes its own ``plan_problem()`` for every variant's task config
    (``contract``: the problem or None), the metrics it declares (``metrics``) and
    whether batch-statistics layers make accumulation inexact (``batch_stats``, a warning;
    ``layers``, those layers);
    or, alone, a ``task.*`` key its declared schema refuses (``keys``: [key, message])."""
    from campaign.errors import TaskContractError
    from campaign.loop.batch_stats import accumulation_warning, layers_on_meta
    from campaign.loop.sharding import units_problem
    from campaign.loop.task import build_task, plan_problem, splits_problem
    from campaign.loop.task_metrics import declared_names
    from campaign.loop.task_order import missing_order
    from campaign.plan.metric_names import declared_metrics
    from campaign.plan.task_keys import task_keys_problem

    problem = task_reference_problem(task)
    if problem is not None:
        return {"reference": problem}
    keys = task_keys_problem(task, configs)
    if keys is not None:  # a typo in a task key runs another experiment: before the rest
        return {"reference": None, "keys": keys}
    sizes = {canonical_json(c["task"]): train_size(task, c) for c in configs}
    metrics, layers, logged = None, None, []
    try:
        built = build_task(task, copy.deepcopy(control))
        metrics = declared_metrics(built)
        logged = declared_names(built)  # the task's own metrics (self.log), as it declares
        layers = layers_on_meta(built)  # recorded: a relaunch's cut of an update is warned of
        contract = (splits_problem(built) or plan_problem(built)
                    or units_problem(built, configs) or missing_order(built, configs)
                    or configs_problem(built, configs, variants or []))
        seen = {canonical_json(control["task"])}
        for name, config in zip(variants or [], configs, strict=False):
            if contract is None and canonical_json(config["task"]) not in seen:
                seen.add(canonical_json(config["task"]))  # another task config: its own check
                contract = plan_problem(build_task(task, copy.deepcopy(config)), name)
    except TaskContractError as error:
        contract = str(error)
    except Exception as error:  # the user's task code
        contract = (f"task code failed while building the task with the control's config: "
                    f"{type(error).__name__}: {error}")
    warning = accumulation_warning(layers or [], configs)
    return {"reference": None, "sizes": sizes, "contract": contract, "metrics": metrics,
            "logged": logged, "batch_stats": warning, "layers": layers or []}


def configs_problem(task: Any, configs: list[dict[str, Any]], variants: list[str]) -> str | None:
    """The task's own check of every variant's whole config (``configs_problem``, optional:
    the Lightning task refuses optimizer keys its module's optimizer would ignore)."""
    check = getattr(task, "configs_problem", None)
    return check(configs, variants) if callable(check) else None


def task_reference_problem(reference: str) -> str | None:
    """What is wrong with the task reference, or None (run in a guarded child)."""
    try:
        load_factory(reference)
    except TaskReferenceError as error:
        return str(error)
    return None


def train_size(task: str, config: dict[str, Any]) -> int | str:
    """The task's training-set size, or why it cannot tell (run in a guarded process)."""
    try:
        built = load_factory(task)(copy.deepcopy(config))
        size = len(built.splits()["train"])
        return size if size > 0 else "the training split is empty"
    except Exception as error:  # the user's task code: any failure means "cannot count"
        return f"{type(error).__name__}: {error}"
