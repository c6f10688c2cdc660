"""A training session for the pilot: the loop's pieces without a run or a ledger.

The pilot drives the same functions as a run (``accumulate``, ``evaluate``,
``capture_state`` / ``restore_state``, the data order, the optimizer and
scheduler builders), so what it proves holds for the runs.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Mapping
from typing import Any

import torch

from campaign.loop.task import Task
from campaign.loop.train import (
    accumulate,
    build_parts,
    capture_state,
    optimizer_step,
    restore_state,
    to_device,
)


class PilotSession:
    def __init__(self, task: Task, config: Mapping[str, Any], device: torch.device) -> None:
        self.task, self.config, self.device = task, dict(config), device
        parts = build_parts(task, config, device)
        self.train_set, self.val_set, self.model = parts.train_set, parts.val_set, parts.model
        self.trainable, self.optimizer = parts.trainable, parts.optimizer
        self.scheduler, self.scaler, self.dtype = parts.scheduler, parts.scaler, parts.dtype
        self.per_update, self.order = parts.per_update, parts.order
        self.microbatch = config["loop"]["microbatch"]
        self.step = 0
        self.last_indices: list[int] = []

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def batches(self, examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            to_device(self.task.collate(examples[i : i + self.microbatch]), self.device)
            for i in range(0, len(examples), self.microbatch)
        ]

    def backward(self, examples: list[dict[str, Any]]) -> tuple[float, int]:
        """Forward and backward of one effective batch (gradients left on the parameters)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        scaler = self.scaler if self.scaler.is_enabled() else None
        return accumulate(
            self.task, self.model, self.batches(examples), scaler=scaler, autocast=self.autocast()
        )

    def step_optimizer(self) -> None:
        self.scaler.unscale_(self.optimizer)
        clip = self.config["loop"]["clip_grad_norm"]
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(self.trainable, clip)
        optimizer_step(self.optimizer, self.scaler)
        self.scheduler.step()
        self.step += 1

    def update(self) -> tuple[float, int]:
        """One update on the next examples of the data order: (mean loss, examples)."""
        self.last_indices = self.order.next_update()
        loss_sum, units = self.backward([self.train_set[i] for i in self.last_indices])
        self.step_optimizer()
        return loss_sum / units, len(self.last_indices)

    def capture(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return capture_state(
            self.model,
            self.optimizer,
            self.scheduler,
            self.scaler,
            self.order,
            step=self.step,
            config=self.config,
        )

    def restore(self, tensors: Mapping[str, torch.Tensor], state: Mapping[str, Any]) -> None:
        restore_state(
            self.model, self.optimizer, self.scheduler, self.scaler, self.order, tensors, state
        )
        self.step = int(state["step"])

    def fingerprint(self) -> dict[str, Any]:
        """What must survive a checkpoint: step, LR, data position (RNG checked by a draw)."""
        state = {
            "step": self.step,
            "lr": self.optimizer.param_groups[0]["lr"],
            "data": self.order.state(),
        }
        generator_state = torch.get_rng_state(), random.getstate()
        state["rng_draw"] = [float(torch.rand(())), random.random()]
        torch.set_rng_state(generator_state[0])
        random.setstate(generator_state[1])
        return state
