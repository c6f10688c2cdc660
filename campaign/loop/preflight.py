"""What a run refuses before any work: settings this process cannot execute as planned.

Each refusal is one line naming the run and what to do instead; the run has
not left ``planned`` (or its claim is ended as failed by the caller).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from campaign.errors import LoopError
from campaign.stack.devices import precision_problem, ranks_problem


def refuse_impossible(
    config: Mapping[str, Any], run_id: str, world: int, device: torch.device,
    resuming: bool = False, replica_leader: bool = True,
) -> None:
    """Raise :class:`LoopError` when ``config`` cannot run in ``world`` processes on ``device``
    (a resume may take another number of ranks: the effective batch is the config's)."""
    loop = config["loop"]
    if loop["replicas"] != world and not resuming:
        raise LoopError(
            f"run {run_id}: loop.replicas = {loop['replicas']} needs that many processes: "
            "run it through `campaign worker` or `campaign launch` (`campaign run` and "
            "`campaign resume` execute one process)"
        )
    if max(loop["replicas"], world) > 1 and loop["precision"] == "fp16":
        raise LoopError(f"run {run_id}: fp16 with replicas is not supported (use bf16)")
    unfit = (precision_problem(loop["precision"], str(device))  # the stack gate's own rules
             or (ranks_problem(world, str(device)) if replica_leader else None))
    if unfit:
        raise LoopError(f"run {run_id}: {unfit}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise LoopError(f"run {run_id}: device {device} requested, but CUDA is unavailable")
