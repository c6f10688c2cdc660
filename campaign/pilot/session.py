"""A training session for the pilot: the run's engine without a run or a ledger.

The pilot trains with the same :class:`~campaign.loop.trainer.Trainer` as every
run (batches, exact forward-backward, gradient norm and clipping, optimizer,
scaler and scheduler step, evaluation, state capture), so what it proves
holds for the runs. Only what the gates need on top lives here: an update
counter, the indices of the last update, and a fingerprint of the state a
resume must restore.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import torch

from campaign.loop import replicas as dp
from campaign.loop.task import Example, TaskContract
from campaign.loop.trainer import SeededSplits, Trainer


class PilotSession(Trainer):
    def __init__(self, task: TaskContract, config: Mapping[str, Any], device: torch.device,
                 replica: dp.Replica | None = None,
                 splits: SeededSplits | None = None) -> None:
        super().__init__(task, config, device, replica, splits)
        self.updates = 0
        self.waits: list[float] = []

    def backward(self, examples: list[Example]) -> tuple[float, int]:
        """Forward and backward of one effective batch (gradients left on the parameters)."""
        return self.forward_backward(self.batches(examples))

    def step_optimizer(self) -> None:
        """What follows the backward in a run's update: unscale, clip, optimizer, scheduler."""
        self.gradient_norm()
        self.step()
        self.updates += 1

    def update(self) -> tuple[float, int]:
        """One update on the next examples of the data order, fed as a run feeds it (the
        configured loader workers): (mean loss, examples); the wait for its batches is kept
        in ``waits``."""
        count, batches, waited = self.next_update()
        self.waits.append(waited)
        loss_sum, units = self.forward_backward(batches)
        self.step_optimizer()
        return loss_sum / units, count

    def capture(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return self.capture_state(step=self.updates, config=dict(self.config))

    def restore(self, tensors: Mapping[str, torch.Tensor], state: Mapping[str, Any]) -> None:
        self.restore_state(tensors, state)
        self.updates = int(state["step"])

    def fingerprint(self) -> dict[str, Any]:
        """What must survive a checkpoint: step, LR, data position (RNG checked by a draw)."""
        state: dict[str, Any] = {"step": self.updates, "lr": self.lr, "data": self.order.state()}
        generator_state = torch.get_rng_state(), random.getstate()
        state["rng_draw"] = [float(torch.rand(())), random.random()]
        torch.set_rng_state(generator_state[0])
        random.setstate(generator_state[1])
        return state
