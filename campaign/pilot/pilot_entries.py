"""What a command asks a task host's child to run for the pilot, importable without torch.

As :mod:`campaign.loop.loop_entries`: the command names these, the child runs them, and
each imports its implementation only there (the pilot's modules import torch).
"""

from __future__ import annotations

from typing import Any


def pilot_documents(url: str, campaign: str, artifacts: str, device: str,
                    overrides: dict[str, Any], only: str | None,
                    every: bool) -> list[dict[str, Any]]:
    """``campaign pilot``: :func:`campaign.pilot.by_class.pilot_documents`."""
    from campaign.pilot.by_class import pilot_documents as pilot

    return pilot(url, campaign, artifacts, device, overrides, only, every)


def inspect_task(reference: str, config: dict[str, Any], campaign: str, split: str,
                 count: int) -> dict[str, Any]:
    """``campaign inspect``: :func:`campaign.pilot.inspect.inspect_task`."""
    from campaign.pilot.inspect import inspect_task as inspect

    return inspect(reference, config, campaign, split, count)
