"""LightningModules as users write them, for the lightning task's tests: a small classifier of
three Gaussian blobs (data made here from a seed, nothing downloaded) with its own optimizer
and step schedule, its datamodule, and modules the campaign's loop must refuse."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def blobs(size: int, seed: int, features: int = 8) -> TensorDataset:
    """``size`` points around three fixed centres (the same for every split), noise from
    ``seed``."""
    centres = torch.randn(3, features, generator=torch.Generator().manual_seed(1234)) * 2
    labels = torch.arange(size) % 3
    noise = torch.randn(size, features, generator=torch.Generator().manual_seed(seed))
    points = centres[labels] + noise
    return TensorDataset(points, labels)


class Blobs(pl.LightningDataModule):
    def __init__(self, size: int = 240, seed: int = 0) -> None:
        super().__init__()
        self.size, self.seed = size, seed

    def setup(self, stage: str) -> None:
        self.train, self.val = blobs(self.size, self.seed), blobs(self.size // 4, self.seed + 1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=8, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=16)


class Classifier(pl.LightningModule):
    def __init__(self, hidden: int = 16, lr: float = 0.05, features: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 3))
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        self.log("train/acc", (logits.argmax(-1) == y).float().mean())
        return nn.functional.cross_entropy(logits, y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val/acc", (logits.argmax(-1) == y).float().mean(), batch_size=len(y))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class OwnData(Classifier):
    """The module's own dataloaders, no datamodule."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(blobs(240, 0), batch_size=8, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(blobs(60, 1), batch_size=16)


class Manual(Classifier):
    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.automatic_optimization = False


class TwoOptimizers(Classifier):
    def configure_optimizers(self) -> Any:
        return [torch.optim.SGD(self.net[0].parameters(), lr=0.1),
                torch.optim.SGD(self.net[2].parameters(), lr=0.1)]


class PerEpoch(Classifier):
    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]


class Hooked(Classifier):
    def on_train_epoch_end(self) -> None:
        self.lr *= 0.5


class Counting(Classifier):
    """Reads Lightning's step counter, which has no equal without its Trainer."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        scale = 1.0 if self.global_step < 10 else 0.5
        return scale * nn.functional.cross_entropy(self(x), y)


class Indexed(Classifier):
    """Reads its batch_idx, which would restart at a resume."""

    def training_step(
        self, batch: Any,
        batch_idx: int,
    ) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y) * (1 + (batch_idx % 2))
