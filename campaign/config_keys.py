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
