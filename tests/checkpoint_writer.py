"""Saves checkpoints in a loop until killed (the kill -9 test runs this as a subprocess)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from campaign.loop import checkpoint as ckpt


def main(folder: str) -> None:
    step = 0
    while True:
        step += 1
        tensors = {"weights": torch.full((512, 1024), float(step)),  # 2 MiB each save
                   "bias": torch.arange(1000, dtype=torch.float64) * step}  # fmt: skip
        ckpt.save(Path(folder) / f"step-{step:08d}.safetensors", tensors, {"step": step})
        print(step, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
