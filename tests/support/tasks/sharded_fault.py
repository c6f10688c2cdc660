"""The arithmetic task (variable-length sequences, a Transformer's blocks as shard units) with
the exact-resume tests' faults, once, at the ``task.at``-th training microbatch (``task.marker``
remembers it): ``task.fault = "sigterm"`` sends SIGTERM to the rank's own process;
``"sigkill_rank1"`` kills rank 1's process with SIGKILL (the OOM killer's way), as a lost rank."""

from __future__ import annotations

import os
import signal
from typing import Any

import torch
from torch import nn

from campaign.tasks.arithmetic import ArithmeticTask
from tests.support.tasks.interrupt import sigterm_once


class InterruptedArithmetic(ArithmeticTask):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__({**config, "task": {k: v for k, v in config.get("task", {}).items()
                                             if k not in ("fault", "at", "marker")}})
        self.options, self.calls = config.get("task", {}), 0

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, int]:
        self.calls += model.training
        sigterm_once(self.options, self.calls, model.training)
        marker = self.options.get("marker")
        if (self.options.get("fault") == "sigkill_rank1" and os.environ.get("RANK") == "1"
                and model.training and self.calls >= int(self.options.get("at", 3))
                and marker and not os.path.exists(marker)):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().loss(model, batch)


def build(config: dict[str, Any]) -> InterruptedArithmetic:
    return InterruptedArithmetic(config)
