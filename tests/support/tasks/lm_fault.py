"""The causal-LM task with ``task.fault = "sigterm"``: SIGTERM once at the ``task.at``-th
training loss (``task.marker`` remembers it), for the exact-resume test."""

from __future__ import annotations

from typing import Any

import torch

from campaign.tasks.causal_lm.instruction_task import CausalLMTask
from tests.support.tasks.interrupt import sigterm_once


class Faulty(CausalLMTask):
    calls = 0

    def loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        self.calls += model.training
        sigterm_once(self.options, self.calls, model.training)
        return super().loss(model, batch)


def build(config: dict[str, Any]) -> Faulty:
    return Faulty(config)
