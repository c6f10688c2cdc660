"""The digits task declaring a stack it cannot have here (the stack-gate tests)."""

from __future__ import annotations

from typing import Any

from campaign.tasks.digits import DigitsTask

REQUIREMENTS = {"packages": {"torch": ">=99"}, "modules": ["no_such_extension_for_campaign"]}


def build(config: dict[str, Any]) -> DigitsTask:
    return DigitsTask(config)
