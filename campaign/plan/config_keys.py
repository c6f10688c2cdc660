"""Dotted keys of a resolved config (``optimizer.lr``): reading one, and comparing the held
ones with the spec's ``[hold]``. Plain Python: listings use it without loading the schema."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def held_deviations(config: Mapping[str, Any], hold: Mapping[str, Any]) -> list[str]:
    """The held keys whose value in ``config`` differs from the spec's [hold] (a relaunch that
    changed them is a deviation from the plan, marked in listings and reports)."""
    return [k for k, v in hold.items() if config_value(config, k) != v]


def config_value(config: Mapping[str, Any], dotted: str) -> Any:
    """The value at a dotted key of a nested config; None when absent."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every leaf of a nested config under its dotted key (``{"optimizer.lr": 0.001, ...}``)."""
    leaves: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            leaves.update(flatten(value, dotted + "."))
        else:
            leaves[dotted] = value
    return leaves


def config_changes(original: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Every dotted key whose value differs: key -> [original's value, other's value]. A key
    present on one side only shows None on the other. Sorted by key."""
    before, after = flatten(original), flatten(other)
    return {
        key: [before.get(key), after.get(key)]
        for key in sorted(before.keys() | after.keys())
        if before.get(key) != after.get(key)
    }
