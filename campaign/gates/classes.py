"""Gate classes: which runs one data gate and one pilot speak for (docs/report.md, pilot phases).

A run's resolved config belongs to a **data class** (the keys that change
what reaches the loss: the task's config, ``loop.max_length``,
``loop.allow_target_truncation``) and a **memory class** (everything that
changes memory or time: the data keys, since the task config holds the
model's, plus the microbatch, accumulation, precision, activation
checkpointing, replicas and optimizer). A pilot runs the data gate and every
phase, so one passing pilot per memory class gates both. Two runs in one
memory class are the same job for the machine, whatever their learning rate
or seed; a variant with a wider model, or a relaunch with another
``max_length``, is another class and needs its own pilot.

Plain Python and no import of ours beyond the canonical JSON: the planner,
the launch, the pilot and the report all use it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from campaign.ledger.canonical import canonical_json, sha256_text
from campaign.plan.config_keys import config_value, flatten

EXECUTABLE = ("planned", "interrupted", "lost")  # the runs a launch could still start
DATA_KEYS = ("task", "loop.max_length", "loop.allow_target_truncation")
MEMORY_KEYS = (*DATA_KEYS, "loop.microbatch", "loop.accumulation", "loop.precision",
               "loop.activation_checkpointing", "loop.replicas", "optimizer.name")
# Keys added since classes were first recorded: in a class only when set otherwise than their
# default, so a ledger's earlier classes keep their ids.
LATER_MEMORY_KEYS = {"loop.strategy": "replicate", "loop.shard_modules": None}


@dataclass(frozen=True)
class GateClass:
    id: str  # 12 hex digits of the memory class's SHA-256
    data_id: str  # the same for the data class
    values: dict[str, Any]  # every memory key's value, dotted

    def describe(self, against: GateClass | None = None) -> str:
        """The class in words: the keys where it differs from ``against`` (all without)."""
        shown = {k: v for k, v in self.values.items()
                 if against is None or against.values.get(k) != v}
        return ", ".join(f"{k}={v!r}" for k, v in shown.items()) or "the control's settings"


def _values(config: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key in keys:
        value = config_value(config, key)
        if isinstance(value, Mapping):
            values.update({f"{key}.{k}": v for k, v in flatten(value).items()})
        else:
            values[key] = value
    return values


def _digest(values: Mapping[str, Any]) -> str:
    return sha256_text(canonical_json(dict(values)))[:12]


def gate_class(config: Mapping[str, Any]) -> GateClass:
    """The gate class of a resolved run config (the sharding strategy included)."""
    memory = _values(config, MEMORY_KEYS)
    memory |= {key: value for key, default in LATER_MEMORY_KEYS.items()
               if (value := config_value(config, key)) not in (None, default)}
    return GateClass(_digest(memory), _digest(_values(config, DATA_KEYS)), memory)


def run_classes(
    ledger: Any, campaign: str, run_ids: Sequence[str] | None = None
) -> dict[str, tuple[GateClass, list[str]]]:
    """Gate class id -> (the class, its run ids) of the runs that could execute (or
    ``run_ids``), in run order."""
    runs = ledger.runs(campaign)
    chosen = runs[runs["run_id"].isin(run_ids)] if run_ids is not None else runs[
        runs["status"].isin(EXECUTABLE)]
    classes: dict[str, tuple[GateClass, list[str]]] = {}
    for run_id, config in zip(chosen["run_id"], chosen["config"], strict=True):
        found = gate_class(config)
        classes.setdefault(found.id, (found, []))[1].append(run_id)
    return classes


PRECISION_RANK = {"fp32": 2, "bf16": 1, "fp16": 1}  # more bytes per value: more memory


def worst_case(runs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The run whose settings need the most memory: microbatch, max length, precision,
    activation checkpointing off (what ``run_pilot`` pilots when it is given no run)."""

    def weight(run: Mapping[str, Any]) -> tuple[Any, ...]:
        loop = run["config"]["loop"]
        length = loop["max_length"] if loop["max_length"] is not None else math.inf
        return (
            loop["microbatch"],
            length,
            PRECISION_RANK[loop["precision"]],
            not loop["activation_checkpointing"],
        )

    return max(runs, key=weight)
