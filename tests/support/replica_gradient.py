"""One rank of the replica-gradient check: ``python -m tests.support.replica_gradient OUT`` with
torchrun's variables set. Writes this rank's gradient after one replicated update."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from campaign.loop import replicas as dp
from tests.support.tasks.quick import QuickTask

MICROBATCHES = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # uneven: normalisation must be global


def model_and_batches() -> tuple[QuickTask, torch.nn.Module, list[dict]]:
    task = QuickTask({"task": {"size": 16}})
    torch.manual_seed(0)
    model = task.model()
    rows = task.splits()["train"]
    return task, model, [task.collate([rows[i] for i in chunk]) for chunk in MICROBATCHES]


def main() -> None:
    replica = dp.Replica(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    task, model, batches = model_and_batches()
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    with dp.process_group(replica, address, port, torch.device("cpu"), timeout_s=60):
        loss_sum, units = dp.accumulate_across(task, model, dp.share(batches, replica), replica)
    grads = {name: p.grad.contiguous() for name, p in model.named_parameters()}
    grads["loss_sum"] = torch.tensor([loss_sum], dtype=torch.float64)
    grads["units"] = torch.tensor([units], dtype=torch.float64)
    save_file(grads, str(Path(sys.argv[1]) / f"rank-{replica.rank}.safetensors"))


if __name__ == "__main__":
    main()
