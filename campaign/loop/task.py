"""The task contract (docs/tasks.md, contract): what a user's task object must provide.

A task is found by reference ``package.module:factory``; the factory gets the
resolved config as a nested dict and returns an object with the parts below.
Tasks see only this contract, never the database.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from campaign.errors import TaskContractError
from campaign.loop.taskref import TaskReferenceError, load_factory

RECORD_KEYS = ("id", "prediction", "target")  # every record predict() returns
CONTRACT = ("model", "splits", "collate", "loss", "predict", "score", "describe", "control_inputs")

Example = dict[str, Any]
Batch = dict[str, Any]


@runtime_checkable
class TaskContract(Protocol):
    def model(self) -> torch.nn.Module: ...
    def splits(self) -> dict[str, Sequence[Example]]: ...
    def collate(self, examples: Sequence[Example]) -> Batch: ...
    def loss(
        self, model: torch.nn.Module, batch: Batch
    ) -> tuple[torch.Tensor, int | torch.Tensor]: ...
    def predict(self, model: torch.nn.Module, batch: Batch) -> list[dict[str, Any]]: ...
    def score(self, records: Sequence[dict[str, Any]]) -> dict[str, float]: ...
    def describe(self, example: Example) -> dict[str, str]: ...
    def control_inputs(self) -> Sequence[Example]: ...


def build_task(reference: str, config: dict[str, Any]) -> TaskContract:
    """Import the factory, build the task, and check every part of the contract is there."""
    try:
        factory = load_factory(reference)
    except TaskReferenceError as error:
        raise TaskContractError(f"task {reference}: {error}") from None
    try:
        task = factory(config)
    except Exception as error:  # the user's factory: report, do not crash the caller
        raise TaskContractError(
            f"task {reference}: the factory failed ({type(error).__name__}: {error})"
        ) from error
    missing = [part for part in CONTRACT if not callable(getattr(task, part, None))]
    if missing:
        raise TaskContractError(
            f"task {reference}: missing {', '.join(missing)} (the task contract: "
            f"{', '.join(CONTRACT)})"
        )
    return task


def check_records(records: Any, where: str = "predict()") -> list[dict[str, Any]]:
    """``records`` as predict() must return them: a list of dicts with id, prediction, target;
    :class:`TaskContractError` naming the function and the missing key otherwise."""
    if not isinstance(records, list):
        raise TaskContractError(f"{where} must return a list of records, got "
                                f"{type(records).__name__}")
    for index, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise TaskContractError(f"{where} record {index} is a {type(record).__name__}, "
                                    "not a dict with id, prediction and target")
        missing = [key for key in RECORD_KEYS if key not in record]
        if missing:
            raise TaskContractError(
                f"{where} record {index} has no {', '.join(repr(k) for k in missing)} "
                f"(its keys: {', '.join(map(repr, record)) or 'none'}); every record needs "
                f"{', '.join(RECORD_KEYS)}"
            )
    return records


def splits_problem(task: TaskContract) -> str | None:
    """Why ``task.splits()`` is not what training reads, in one line, or None: a mapping with
    non-empty ``train`` and ``val`` splits, each a sized, indexable sequence (a list, a
    dataset with ``__len__`` and ``__getitem__``; a generator is read once and has no
    length)."""
    try:
        splits = task.splits()
    except Exception as error:  # the user's task code
        return f"splits() failed: {type(error).__name__}: {error}"
    if not isinstance(splits, Mapping):
        return (f"splits() must return a mapping of split name -> examples, got "
                f"{type(splits).__name__}")
    for name in ("train", "val"):
        if name not in splits:
            have = ", ".join(map(repr, splits)) or "none"
            return f"splits() has no {name!r} split (it has {have})"
    for name, dataset in splits.items():
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            return (f"splits()[{name!r}] is a {type(dataset).__name__}: a split must be a sized, "
                    "indexable sequence (a list, or a dataset with __len__ and __getitem__)")
        try:
            size = len(dataset)
        except (TypeError, ValueError, OverflowError) as error:
            return f"splits()[{name!r}] has no usable length ({error})"
        if size == 0 and name in ("train", "val"):
            return f"splits()[{name!r}] is empty"
    return None


def plan_problem(task: TaskContract, variant: str | None = None) -> str | None:
    """The task's own ``plan_problem()`` (optional: what it can refuse without training, such
    as a LoRA target naming no module), naming ``variant`` when it is not the control's."""
    check = getattr(task, "plan_problem", None)
    if not callable(check):
        return None
    try:
        problem = check()
    except Exception as error:  # the user's task code
        problem = f"plan_problem() failed: {type(error).__name__}: {error}"
    if problem is None:
        return None
    return f"variant {variant!r}: {problem}" if variant else str(problem)
