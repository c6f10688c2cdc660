"""The training engine shared by runs and the pilot: one ``Trainer`` per configuration.

What a run records around it (ledger, stop rules, checkpoints on disk,
heartbeat) lives in ``loop.train``; what the pilot checks around it lives in
``pilot``. Both drive the same methods, so a gate that passes in the pilot
passed on the code the runs execute. The inner update, read top to bottom:

    batches = trainer.batches(trainer.next_examples())
    loss_sum, units = trainer.forward_backward(batches)   # exact over the effective batch
    grad_norm = trainer.gradient_norm()                  # unscale, clip
    trainer.step()                                       # optimizer, scaler, scheduler

Exact normalisation: the task returns the *sum* of per-unit losses and the
number of units; sums are backpropagated and the gradients divided by the
units of the whole effective batch, so accumulation, padding, variable
lengths, data replicas and an incomplete last batch give one big batch's
gradient. Mixed precision: bf16 autocast, or fp16 autocast with a GradScaler
whose update follows the optimizer step of the effective batch.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint as activation_checkpoint

from campaign.loop import checkpoint as ckpt
from campaign.loop import progress
from campaign.loop import replicas as dp
from campaign.loop.data import DataOrder, to_device
from campaign.loop.errors import LoopError
from campaign.loop.task import Batch, Example, Task, check_records

PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
NO_UNITS = "an effective batch with no loss units (every target masked out)"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    """Model, optimizer, scheduler, scaler and data order of one resolved config, and the step.

    Built in the order a resume relies on: seed, data, model (activation
    checkpointing), optimizer, scheduler, scaler, data order.
    """

    def __init__(
        self,
        task: Task,
        config: Mapping[str, Any],
        device: torch.device,
        replica: dp.Replica | None = None,
    ) -> None:
        loop = config["loop"]
        self.task, self.config, self.device = task, config, device
        self.replica = replica or dp.Replica(0, 1)
        self.seed = int(config.get("seed", 0))
        seed_everything(self.seed)
        data = task.splits()
        self.train_set: list[Example] = list(data["train"])
        self.val_set: list[Example] = list(data["val"])
        self.model = task.model().to(device)
        if loop["activation_checkpointing"]:
            checkpoint_blocks(self.model)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(self.trainable, config["optimizer"])
        self.scheduler = build_scheduler(self.optimizer, config)
        # A constant rate without warmup never changes: the per-update scheduler step is skipped.
        self.schedules = config["scheduler"]["name"] != "constant" or config["scheduler"]["warmup"]
        self.scaler = torch.amp.GradScaler(device.type, enabled=loop["precision"] == "fp16")
        self.dtype = PRECISION_DTYPES.get(loop["precision"])
        self.microbatch = int(loop["microbatch"])
        self.per_update = self.microbatch * loop["accumulation"] * loop["replicas"]
        validation = config.get("validation") or {}
        self.val_batch = int(validation.get("microbatch") or self.microbatch * loop["accumulation"])
        self.clip: float | None = loop["clip_grad_norm"]
        self.order = DataOrder(len(self.train_set), self.seed, self.per_update, loop["last_batch"])
        self._single_group = len({(p.device, p.dtype) for p in self.trainable}) == 1

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16/fp16 autocast as configured; a no-op context in fp32."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def next_examples(self) -> list[Example]:
        """The examples of the next update, in the run's data order."""
        return [self.train_set[i] for i in self.order.next_update()]

    def batches(self, examples: Sequence[Example]) -> list[Batch]:
        """Microbatches of ``examples`` (this replica's share), collated and on the device."""
        chunks = [
            examples[i : i + self.microbatch] for i in range(0, len(examples), self.microbatch)
        ]
        if self.replica.world > 1:
            chunks = dp.share(chunks, self.replica)
        return [to_device(self.task.collate(list(chunk)), self.device) for chunk in chunks]

    def forward_backward(self, batches: Sequence[Batch]) -> tuple[float, int]:
        """Train mode, fresh gradients, then the effective batch's (loss sum, units).

        The gradients left on the parameters are those of (loss sum / units)
        over the whole effective batch (every replica's share included).
        """
        if not self.model.training:  # train() walks every module: only when needed
            self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        if self.replica.world > 1:
            return dp.accumulate_across(
                self.task, self.model, batches, self.replica, self.autocast()
            )
        scaler = self.scaler if self.scaler.is_enabled() else None
        return accumulate(self.task, self.model, batches, scaler=scaler, autocast=self.autocast())

    def gradient_norm(self) -> float:
        """Unscale (fp16), clip to ``loop.clip_grad_norm`` when set; the total gradient norm.

        Without clipping, the fused per-tensor norms are combined directly:
        ``get_total_norm`` first regroups tensors by device and dtype in Python,
        which costs more than the norms on a small model.
        """
        self.scaler.unscale_(self.optimizer)
        if self.clip is not None:
            return float(torch.nn.utils.clip_grad_norm_(self.trainable, self.clip))
        grads = [p.grad for p in self.trainable if p.grad is not None]
        if not grads:
            return 0.0
        if self._single_group:
            return float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))))
        return float(torch.nn.utils.get_total_norm(grads))

    def step(self) -> None:
        """The optimizer step (through the scaler with fp16, updated once per effective batch),
        then the scheduler's."""
        if self.scaler.is_enabled():
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.schedules:
            self.scheduler.step()

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def evaluate(
        self, examples: Sequence[Example], batch_size: int
    ) -> tuple[float, int, list[dict[str, Any]]]:
        """Validation over ``examples``: eval mode, no gradients; (loss sum, units, predictions)."""
        return evaluate(self.task, self.model, examples, batch_size, self.device, self.autocast)

    def capture_state(self, **extra: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Everything a resume needs, as (tensors, JSON document) for a checkpoint file."""
        tensors: dict[str, torch.Tensor] = {}
        state = {
            "model": ckpt.split_state("model", self.model.state_dict(), tensors),
            "optimizer": ckpt.split_state("optimizer", self.optimizer.state_dict(), tensors),
            "scheduler": ckpt.split_state("scheduler", self.scheduler.state_dict(), tensors),
            "scaler": self.scaler.state_dict(),
            "rng": ckpt.rng_state(tensors),
            "data": self.order.state(),
            **extra,
        }
        return tensors, state

    def restore_state(self, tensors: Mapping[str, torch.Tensor], state: Mapping[str, Any]) -> None:
        """The inverse of :meth:`capture_state` (RNG states and data position included)."""
        self.model.load_state_dict(ckpt.join_state(state["model"], tensors))
        self.optimizer.load_state_dict(ckpt.join_state(state["optimizer"], tensors))
        self.scheduler.load_state_dict(ckpt.join_state(state["scheduler"], tensors))
        self.scaler.load_state_dict(state["scaler"])
        ckpt.restore_rng(state["rng"], tensors)
        self.order.restore(state["data"])


def accumulate(
    task: Task,
    model: torch.nn.Module,
    batches: Sequence[Batch],
    *,
    scaler: torch.amp.GradScaler | None = None,
    autocast: contextlib.AbstractContextManager[Any] | None = None,
) -> tuple[float, int]:
    """Backpropagate every microbatch's loss *sum*, then divide the gradients by all units.

    Returns (loss sum, units) of the effective batch: exactly one big batch's
    gradients, whatever the split into microbatches.
    """
    context = autocast if autocast is not None else contextlib.nullcontext()
    if len(batches) == 1 and scaler is None:
        # One microbatch: its units are known before the backward, so the loss
        # can be normalised first and the extra pass over the gradients saved.
        with context:
            loss_sum, count = task.loss(model, batches[0])
        _check_units(count)
        if int(count) == 0:
            raise LoopError(NO_UNITS)
        (loss_sum / count).backward()
        return float(loss_sum.detach()), int(count)
    total = torch.zeros((), dtype=torch.float64)
    units = 0
    for batch in batches:
        progress.tick()
        with context:
            loss_sum, count = task.loss(model, batch)
        _check_units(count)
        (scaler.scale(loss_sum) if scaler is not None else loss_sum).backward()
        total += loss_sum.detach().to(torch.float64).cpu()
        units += int(count)
    if units == 0:
        raise LoopError(NO_UNITS)
    for parameter in model.parameters():
        if parameter.grad is not None:
            parameter.grad.div_(units)
    return float(total), units


def _check_units(count: Any) -> None:
    """``loss()`` counts units: a negative count would turn the normalised loss upside down
    (the optimiser would climb it and the run end ``completed``)."""
    if int(count) < 0:
        raise LoopError(f"loss() returned {int(count)} units: a number of units is never negative")


@torch.no_grad()
def evaluate(
    task: Task,
    model: torch.nn.Module,
    examples: Sequence[Example],
    batch_size: int,
    device: torch.device,
    autocast: Any = contextlib.nullcontext,
) -> tuple[float, int, list[dict[str, Any]]]:
    """Validation: eval mode, no gradients, loss over all units and every prediction.

    The model is back in train mode afterwards, whatever happens inside.
    """
    model.eval()
    total, units, records = 0.0, 0, []
    try:
        for start in range(0, len(examples), batch_size):
            progress.tick()
            batch = to_device(task.collate(list(examples[start : start + batch_size])), device)
            with autocast():
                loss_sum, count = task.loss(model, batch)
            _check_units(count)
            total += float(loss_sum)
            units += int(count)
            records.extend(check_records(task.predict(model, batch)))
    finally:
        model.train()
    return total, units, records


def build_optimizer(
    parameters: Sequence[torch.nn.Parameter], options: Mapping[str, Any]
) -> torch.optim.Optimizer:
    if options["name"] == "sgd":
        return torch.optim.SGD(
            parameters,
            lr=options["lr"],
            momentum=options["momentum"],
            weight_decay=options["weight_decay"],
        )
    return torch.optim.AdamW(
        parameters,
        lr=options["lr"],
        weight_decay=options["weight_decay"],
        betas=(options["beta1"], options["beta2"]),
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: Mapping[str, Any]
) -> torch.optim.lr_scheduler.LambdaLR:
    """constant, linear_warmup (then constant) or cosine (after the warmup) as LR factors."""
    name = config["scheduler"]["name"]
    warmup = int(config["scheduler"]["warmup"])
    total = int(config["budget"]["updates"])

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if name == "cosine":
            progress = (step - warmup) / max(1, total - warmup)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def checkpoint_blocks(model: torch.nn.Module) -> None:
    """Wrap each module of ``model.blocks`` with activation checkpointing."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, torch.nn.ModuleList):
        raise LoopError("loop.activation_checkpointing needs a model with a `blocks` ModuleList")
    for block in blocks:
        forward = block.forward

        def checkpointed(*args: Any, _forward: Any = forward, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return _forward(*args, **kwargs)
            return activation_checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = checkpointed  # type: ignore[method-assign]
