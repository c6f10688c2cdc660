"""Sharded runs (``loop.strategy = "fsdp"``): the model's units wrapped with PyTorch's FSDP2.

``fully_shard`` splits every parameter along its first dimension across the run's ranks
(``torch.chunk``: rank r holds chunk r), and so the gradients and the optimizer state built
over them. The units are the task's repeated blocks, found in this order (docs/runs.md,
"Sharded runs"): the module list named by ``loop.shard_modules``; the task's own
``shard_units(model)``; a Hugging Face model's ``_no_split_modules`` classes; the whole model
as one unit, the last resort (then only the optimizer state and gradients of the whole are
sharded between forwards, and a rank holds the full parameters during each). What was chosen
is said in the run's ``sharding`` event.

Exactness, as with replicas: every rank backpropagates loss *sums*; the reduce-scatter is
forced to a plain sum (FSDP averages by default) and the gradients are divided by the units of
the whole effective batch. Every forward and backward is a collective (each unit's parameters
are gathered), so every rank takes as many microbatches as the rank with the most; a rank
short of one repeats a batch of its own in eval mode with its loss multiplied by zero (no
gradient, no BatchNorm statistics, no dropout draw). Precision: FSDP's policy gathers float32
parameters and reduces in float32; ``loop.precision = "bf16"`` is the loop's autocast, as in
one process, so a bf16 run takes one process's bf16 series and its control outputs replay in
a fresh process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from campaign.errors import LoopError
from campaign.loop import progress_page, task_metrics
from campaign.loop.replicas import Replica
from campaign.loop.task import Batch, TaskContract


@dataclass(frozen=True)
class Sharding:
    """How a run's model was sharded: its units and, in words, how they were found (the
    ``sharding`` event's detail)."""

    units: int
    how: str

    def describe(self, world: int) -> str:
        return f"FSDP2 over {world} ranks, {self.units} units: {self.how}"


def is_sharded(tensor: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor (every rank must call this for a sharded one: it gathers)."""
    return tensor.full_tensor() if is_sharded(tensor) else tensor  # type: ignore[attr-defined]


def find_units(model: torch.nn.Module, task: Any, named: str | None) -> tuple[list[Any], str]:
    """The modules to shard one by one, and how they were found (see the module docstring)."""
    if named:
        try:
            blocks = model.get_submodule(named)
        except AttributeError:
            blocks = None
        if not isinstance(blocks, torch.nn.ModuleList | torch.nn.Sequential) or not len(blocks):
            raise LoopError(f"loop.shard_modules = {named!r} is not a module list of the model "
                            "(name the list of repeated blocks, e.g. 'transformer.h')")
        return list(blocks), f"loop.shard_modules = {named!r}"
    own = getattr(task, "shard_units", None)
    if callable(own):
        units = list(own(model))
        if not units or not all(isinstance(u, torch.nn.Module) for u in units):
            raise LoopError("the task's shard_units(model) must return the model's modules")
        return units, "the task's shard_units()"
    classes = set(_no_split_classes(model))
    if classes:
        units = [m for m in model.modules() if type(m).__name__ in classes and m is not model]
        if units:
            return units, f"the model's _no_split_modules ({', '.join(sorted(classes))})"
    return [], ("the whole model as one unit (no loop.shard_modules, no task shard_units(), "
                "no _no_split_modules): name the repeated blocks to shard them one by one")


def units_problem(task: Any, configs: Sequence[dict[str, Any]]) -> str | None:
    """Why a sharded variant's units cannot be found in the task's model, built on the meta
    device (no memory, no weights); None when they can, or when no variant shards, or when the
    model cannot be built on the meta device (the pilot says it then)."""
    named = {(c.get("loop") or {}).get("shard_modules") for c in configs
             if (c.get("loop") or {}).get("strategy") == "fsdp"}
    if not named:
        return None
    try:
        with torch.device("meta"):
            model = task.model()
    except Exception:
        return None
    for name in sorted(named, key=str):
        try:
            find_units(model, task, name)
        except LoopError as error:
            return str(error)
    return None


def block_list(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The model's largest ``ModuleList`` by parameters (a transformer's layers), or None."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    if not lists:
        return None
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))


def _no_split_classes(model: torch.nn.Module) -> list[str]:
    """Hugging Face's ``_no_split_modules`` of the model or of the model it wraps (PEFT)."""
    for module in model.modules():
        names = getattr(module, "_no_split_modules", None)
        if names:
            return [str(n) for n in names]
    return []


def shard(model: torch.nn.Module, task: Any, loop: dict[str, Any], device: torch.device,
          replica: Replica) -> Sharding:
    """Wrap ``model`` in place with ``fully_shard`` over the run's ranks; sums, not means."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    units, how = find_units(model, task, loop.get("shard_modules"))
    mesh = init_device_mesh(device.type, (replica.world,))
    # float32 parameters gathered and gradients reduced; bf16 is the loop's autocast, as in
    # one process (a bfloat16 param_dtype would compute every op in bf16: another series,
    # and control outputs a float32 replay could not reproduce)
    policy = MixedPrecisionPolicy(param_dtype=None, reduce_dtype=torch.float32)
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):  # a plain sum across ranks (gloo has no PREMUL_SUM)
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return Sharding(max(1, len(units)), how)


def accumulate_sharded(
    task: TaskContract,
    model: torch.nn.Module,
    batches: Sequence[Batch],
    filler: Callable[[], Batch],
    autocast: contextlib.AbstractContextManager[Any] | None = None,
) -> tuple[float, int]:
    """This rank's microbatches (loss sums backpropagated, gradients reduce-scattered as sums),
    padded to the group's most with zero-weight fillers; the gradients divided by the whole
    effective batch's units. Returns the global (loss sum, units)."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    local = parameters[0].to_local() if parameters and is_sharded(parameters[0]) else None
    device = local.device if local is not None else torch.device("cpu")
    most = torch.tensor([len(batches)], dtype=torch.int64, device=device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    total = torch.zeros(2, dtype=torch.float64, device=device)
    context = autocast if autocast is not None else contextlib.nullcontext()
    for index in range(int(most.item())):
        padding = index >= len(batches)
        batch = (batches[-1] if batches else filler()) if padding else batches[index]
        progress_page.tick("forward")  # a supervisor names the phase a hang is in
        if padding:
            model.eval()
        try:
            with context, task_metrics.paused() if padding else contextlib.nullcontext():
                loss_sum, count = task.loss(model, batch)
            progress_page.tick("backward")
            (loss_sum * 0.0 if padding else loss_sum).backward()
        finally:
            if padding:
                model.train()
        if not padding:
            total[0] += loss_sum.detach().to(torch.float64)
            total[1] += int(count)
    dist.all_reduce(total)
    units = int(total[1].item())
    if units == 0:
        raise LoopError("an effective batch with no loss units (every target masked out)")
    for parameter in parameters:
        if parameter.grad is not None:
            parameter.grad.div_(units)
    return float(total[0].item()), units


def gradient_norm(parameters: Sequence[torch.nn.Parameter], clip: float | None) -> float:
    """The total gradient norm over every rank's shards (clipped to ``clip`` when set), by
    torch's own ``clip_grad_norm_`` on the DTensor gradients."""
    grads = [p for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(grads, clip if clip is not None else float("inf"))
    return float(full(norm))
