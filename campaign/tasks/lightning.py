"""``campaign.tasks.lightning:build``: a ``LightningModule`` as a task, unchanged (extra
``campaign[lightning]``). Nothing of Lightning is imported until the task is built.

The spec names the module class (``task.module = "pkg.mod:Class"``; every task key but
those below is an argument of its ``__init__``) and its data: ``task.datamodule`` (a
``LightningDataModule`` class, its arguments in ``task.datamodule_args``) or the module's
own ``train_dataloader()`` and ``val_dataloader()``. ``task.optimizer``: ``"module"`` (the
default: ``configure_optimizers`` gives the optimizer and the scheduler) or ``"spec"`` (the
spec's ``optimizer.*`` and ``scheduler.*`` keys). See docs/tasks.md, "A LightningModule".
"""

from __future__ import annotations

from typing import Any

# Imported once by a worker that forks its runs.
PRELOAD = ("lightning", "campaign.tasks.lightning_task")


def build(config: dict[str, Any]) -> Any:
    import importlib.util

    if importlib.util.find_spec("lightning") is None:  # found without importing it
        raise ImportError("the lightning task needs lightning: pip install 'campaign[lightning]'")
    from campaign.tasks.lightning_task import LightningTask

    return LightningTask(config)
