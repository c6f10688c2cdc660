"""Saves checkpoints in a loop until killed (the kill -9 test forks this from a fork server
that has torch imported already, or runs it as
``python -m tests.support.checkpoint_writer DIR``)."""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection
from pathlib import Path

import torch

from campaign.loop import checkpoint as ckpt


def main(folder: str, ready: Connection | None = None) -> None:
    """Save checkpoints until killed; after each, say its step (on ``ready`` or stdout)."""
    step = 0
    while True:
        step += 1
        tensors = {"weights": torch.full((512, 1024), float(step)),  # 2 MiB each save
                   "bias": torch.arange(1000, dtype=torch.float64) * step}
        ckpt.save(Path(folder) / f"step-{step:08d}.safetensors", tensors, {"step": step})
        if ready is not None:
            ready.send(step)
        else:
            print(step, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
