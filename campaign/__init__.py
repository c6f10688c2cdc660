"""campaign: PyTorch training-experiment campaigns with the discipline of a careful lab.

The notebook entry point is :class:`campaign.Ledger`::

    from campaign import Ledger
    ledger = Ledger.open("sqlite:///campaign.db")
    runs = ledger.runs("digits-lr")

A task subclasses :class:`campaign.Task` and writes ``model``, ``splits``
and ``loss``. ``Ledger`` and ``Task`` are imported on first use: the command
line imports this package and must not pay for pandas, SQLAlchemy or torch
before it knows what to do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from campaign.loop.task_base import Task
    from campaign.loop.task_metrics import log_metric
    from campaign.notebook import NotebookLedger as Ledger

__all__ = ["Ledger", "Task", "__version__", "log_metric"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "Ledger":
        from campaign.notebook import NotebookLedger

        return NotebookLedger
    if name == "Task":  # the task base class (imports torch: only when a task asks for it)
        from campaign.loop.task_base import Task

        return Task
    if name == "log_metric":  # a task not derived from Task logs with this (no torch import)
        from campaign.loop.task_metrics import log_metric

        return log_metric
    raise AttributeError(f"module 'campaign' has no attribute {name!r}")
