"""A plain PyTorch training script, as one finds it in a colleague's repository: the wine
cultivars (the 178 wines scikit-learn ships inside its package: no download) classified by a
small MLP. docs/porting.md ports it to a campaign task (examples/tasks/wine.py) step by step;
the task imports ``build_model`` and ``load_arrays`` from here unchanged.

    python examples/porting/train_wine.py --steps 300 --lr 1e-3
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from sklearn.datasets import load_wine
from torch import nn


def load_arrays(seed: int = 0, val_fraction: float = 0.25) -> dict[str, np.ndarray]:
    """Features standardised with the training rows' statistics, and the labels, per split."""
    data = load_wine()
    order = np.random.default_rng(seed).permutation(len(data.target))
    cut = int(len(order) * (1 - val_fraction))
    train_rows, val_rows = order[:cut], order[cut:]
    mean, std = data.data[train_rows].mean(axis=0), data.data[train_rows].std(axis=0) + 1e-8
    features = ((data.data - mean) / std).astype(np.float32)
    return {"train_x": features[train_rows], "train_y": data.target[train_rows],
            "val_x": features[val_rows], "val_y": data.target[val_rows],
            "train_rows": train_rows, "val_rows": val_rows}


def build_model(hidden: int = 32) -> nn.Module:
    return nn.Sequential(nn.Linear(13, hidden), nn.ReLU(), nn.Linear(hidden, 3))


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> float:
    """One step: the batch's mean cross-entropy, backward, step."""
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def evaluate(model: nn.Module, arrays: dict[str, np.ndarray]) -> tuple[float, float]:
    """The validation split's mean cross-entropy and accuracy."""
    with torch.no_grad():
        logits = model(torch.from_numpy(arrays["val_x"]))
        loss = nn.functional.cross_entropy(logits, torch.from_numpy(arrays["val_y"]))
    accuracy = float((logits.argmax(-1).numpy() == arrays["val_y"]).mean())
    return float(loss), accuracy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--log", help="also write every step's numbers here (JSON lines)")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    arrays = load_arrays()
    x, y = torch.from_numpy(arrays["train_x"]), torch.from_numpy(arrays["train_y"])
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(args.seed)
    log = open(args.log, "w") if args.log else None  # noqa: SIM115 (open for the whole run)
    for step in range(args.steps):  # counted from 0; evaluated after the step
        batch = torch.randint(len(y), (args.batch,), generator=generator)
        loss = train_step(model, optimizer, x[batch], y[batch])
        record: dict[str, float] = {"step": step, "loss": loss}
        if step % args.eval_every == 0 or step == args.steps - 1:
            record["val_loss"], record["val_accuracy"] = evaluate(model, arrays)
            print(f"step {step}: loss {loss:.4f}, val loss {record['val_loss']:.4f}, "
                  f"val accuracy {record['val_accuracy']:.3f}")
        if log is not None:
            log.write(json.dumps(record) + "\n")
    if log is not None:
        log.close()


if __name__ == "__main__":
    main()
