"""What a command asks a task host's child to run in the loop, importable without torch.

The command line never imports torch (docs/processes.md): it names the function a child of
the task host runs, and the child imports it. These entries are that name: each imports its
implementation when the child calls it, so the command's process stays torch-free while a
reader (and go-to-definition) follows the call from the command to the code that runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def export_run(url: str, run_id: str, target: str, merge: bool, card: str) -> dict[str, Any]:
    """``campaign export``: :func:`campaign.loop.export_folder.export_run`."""
    from campaign.loop.export_folder import export_run as export

    return export(url, run_id, target, merge, card)


def replay_recorded(url: str, run_id: str, device: str = "cpu") -> dict[str, Any]:
    """``campaign replay``: :func:`campaign.loop.replay.replay_recorded`."""
    from campaign.loop.replay import replay_recorded as replay

    return replay(url, run_id, device)


def update_order(task_reference: str, config: Mapping[str, Any], first: int,
                 last: int) -> list[dict[str, Any]]:
    """``campaign order``: :func:`campaign.loop.order_view.update_order`."""
    from campaign.loop.order_view import update_order as order

    return order(task_reference, config, first, last)
