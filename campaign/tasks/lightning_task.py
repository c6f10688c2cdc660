"""A ``LightningModule`` and its data run by the campaign's loop (docs/tasks.md, "A
LightningModule"): :mod:`campaign.tasks.lightning` builds it.

What the loop takes of the module, and how:

- **data**: the datasets of the datamodule's (or the module's own) ``train_dataloader()``
  and ``val_dataloader()``, each example ``{"id": "train-17", "split", "item"}`` around the
  dataset's own item, collated by that loader's ``collate_fn``; the order is the campaign's
  (the loaders' samplers and batch sizes are not used: ``loop.microbatch`` is the batch);
- **the loss**: ``training_step(batch, batch_idx)``'s loss (or its ``"loss"``), a mean over
  the microbatch, returned as a sum (the mean times the microbatch's examples) over that
  many units: with equal microbatches an update's gradient is Lightning's
  ``accumulate_grad_batches`` one; with unequal ones the campaign weighs each example
  equally where Lightning weighs each microbatch equally;
- **metrics**: ``self.log``/``self.log_dict`` reach the ledger as a task's own metrics
  (:mod:`campaign.loop.task_metrics`, ``batch_size`` as the weight), from
  ``training_step`` in an update and from ``validation_step`` in a validation (validation
  computes ``val/loss`` with ``training_step``, its logging off);
- **predictions** (the replay, the overfit gate): ``predict_step`` when the module defines
  one, else ``forward`` on the batch's first element; a classifier's logits become the
  argmax against the batch's second element;
- **the optimizer**: ``configure_optimizers`` (one optimizer, a scheduler stepped per
  update) unless ``task.optimizer = "spec"``; the run's ``optimizer`` event says which.

What the loop cannot honour exactly is refused at ``plan`` in one line: manual
optimization, several optimizers, a scheduler stepped per epoch or on a metric, a hook the
loop does not call (:data:`UNHONOURED`), an argument the module's ``__init__`` does not
take.
"""

from __future__ import annotations

import difflib
import inspect
import types
from collections.abc import Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
import torch

from campaign.loop import task_metrics
from campaign.loop.taskref import TaskReferenceError, load_factory

# Hooks Lightning's Trainer calls around steps, batches and epochs that this loop does not:
# a module overriding one would train differently here, so plan refuses it.
UNHONOURED = (
    "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer",
    "on_train_batch_start", "on_train_batch_end", "on_train_epoch_start", "on_train_epoch_end",
    "on_validation_batch_start", "on_validation_batch_end", "on_validation_epoch_start",
    "on_validation_epoch_end", "on_before_backward", "backward", "on_after_backward",
    "on_before_optimizer_step", "optimizer_step", "optimizer_zero_grad", "on_before_zero_grad",
    "lr_scheduler_step", "configure_gradient_clipping", "on_fit_start", "on_train_start",
)
RESERVED = ("module", "datamodule", "datamodule_args", "optimizer")  # not __init__ arguments
DEFAULT_OPTIMIZER = {"name": "adamw", "lr": 1e-3, "weight_decay": 0.0, "decay": "all",
                     "momentum": 0.0, "beta1": 0.9, "beta2": 0.999}


def _class(reference: str, key: str, base: type) -> type:
    try:
        found = load_factory(reference)
    except TaskReferenceError as error:
        raise ValueError(f"{key}: {error}") from None
    if not (inspect.isclass(found) and issubclass(found, base)):
        raise ValueError(f"{key}: {reference} is not a {base.__name__} subclass")
    return found


def overrides(module: Any, hook: str) -> bool:
    """Whether ``module``'s class defines ``hook`` itself (not Lightning's default)."""
    mine = getattr(type(module), hook, None)
    return mine is not None and mine is not getattr(pl.LightningModule, hook, None)


class Examples:
    """A dataset's items as the campaign's examples (nothing is read until asked)."""

    def __init__(self, dataset: Any, split: str) -> None:
        self.dataset, self.split = dataset, split

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"id": f"{self.split}-{index}", "split": self.split, "item": self.dataset[index]}


class LightningTask:
    """The task contract (docs/tasks.md) around a LightningModule class."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.options: dict[str, Any] = dict(config.get("task") or {})
        reference = self.options.get("module")
        if not isinstance(reference, str):
            raise ValueError("task.module: the LightningModule class is required, e.g. "
                             "\"mypackage.models:Classifier\"")
        self.module_class = _class(reference, "task.module", pl.LightningModule)
        self.module_args = {k: v for k, v in self.options.items() if k not in RESERVED}
        self.source = self.options.get("optimizer", "module")
        if self.source not in ("module", "spec"):
            raise ValueError(f"task.optimizer: 'module' (configure_optimizers) or 'spec' "
                             f"(optimizer.* keys), got {self.source!r}")
        self.control_count = 4
        self._loaders: dict[str, Any] | None = None
        self.examples = 1  # the current microbatch's examples

    # -- the module and its data -----------------------------------------------------------
    def _module(self) -> Any:
        try:
            return self.module_class(**self.module_args)
        except (MemoryError, torch.cuda.OutOfMemoryError):
            raise  # a run's stop cause (oom), not a refusal of its arguments
        except Exception as error:  # the user's __init__, given the spec's task keys
            raise ValueError(f"task.module: {self.module_class.__name__}({self._given()}) "
                             f"failed: {type(error).__name__}: {error}") from error

    def _given(self) -> str:
        """The module's arguments as the spec gives them (task.lr='fast'), for an error line."""
        return ", ".join(f"task.{key}={value!r}" for key, value in self.module_args.items())

    def _dataloaders(self) -> dict[str, Any]:
        if self._loaders is None:
            reference = self.options.get("datamodule")
            if reference:
                kind = _class(str(reference), "task.datamodule", pl.LightningDataModule)
                source = kind(**dict(self.options.get("datamodule_args") or {}))
                source.prepare_data()
                source.setup("fit")
            else:
                source = self._module()
                for hook in ("train_dataloader", "val_dataloader"):
                    if not overrides(source, hook):
                        raise ValueError(f"task.datamodule: none is named and "
                                         f"{self.module_class.__name__} has no {hook}()")
            self._loaders = {"train": source.train_dataloader(), "val": source.val_dataloader()}
        return self._loaders

    def splits(self) -> dict[str, Examples]:
        return {name: Examples(loader.dataset, name)
                for name, loader in self._dataloaders().items()}

    def collate(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        if not examples:
            raise ValueError("collate() was given no examples")
        loader = self._dataloaders()[examples[0]["split"]]
        collate = loader.collate_fn or torch.utils.data.default_collate
        return {"batch": collate([e["item"] for e in examples]),
                "ids": [e["id"] for e in examples]}

    def model(self) -> torch.nn.Module:
        module = self._module()
        if overrides(module, "setup"):  # as Lightning's Trainer calls them, in this order
            module.setup("fit")
        if overrides(module, "configure_model"):
            module.configure_model()
        route_logging(module, self)
        return module

    # -- what plan refuses ------------------------------------------------------------------
    def plan_problem(self) -> str | None:
        """The first thing the loop cannot honour exactly, in one line, or None."""
        name = self.module_class.__name__
        problem = _arguments_problem(self.module_class, self.module_args)
        if problem:
            return problem
        try:
            module = self._module()
            hook = next((h for h in UNHONOURED if overrides(module, h)), None)
            if hook:
                return (f"task.module: {name} overrides {hook}(), a hook the campaign's loop "
                        "does not call: move what it does into training_step or "
                        "validation_step (docs/tasks.md, 'A LightningModule')")
            if not module.automatic_optimization:
                return (f"task.module: {name} uses manual optimization (automatic_optimization"
                        " = False); the campaign's loop takes one optimizer step per update")
            problem = _reads_problem(self.module_class)
            if problem:
                return problem
            if self.source == "module":
                try:
                    given = module.configure_optimizers()
                except Exception as error:  # the user's code, on the spec's arguments
                    return (f"task.module: {name}.configure_optimizers() failed with "
                            f"{self._given() or 'no task arguments'}: "
                            f"{type(error).__name__}: {error}")
                parse_optimizers(given, name)
        except ValueError as error:
            return str(error)
        return None

    def configs_problem(self, configs: Sequence[Mapping[str, Any]],
                        variants: Sequence[str]) -> str | None:
        """Of every variant's config: while ``configure_optimizers`` gives the optimizer, an
        ``optimizer.*`` or ``scheduler.*`` key set in the spec would be ignored, silently."""
        for name, config in zip(variants, configs, strict=False):
            if (config.get("task") or {}).get("optimizer", "module") == "module":
                problem = _spec_optimizer_problem(config)
                if problem:
                    return f"variant {name!r}: {problem}"
        return None

    def configure_optimizer(self, model: Any) -> tuple[Any, Any] | None:
        """The module's optimizer and scheduler (``configure_optimizers``), or None: the
        spec's (``task.optimizer = "spec"``)."""
        if self.source == "spec":
            return None
        return parse_optimizers(model.configure_optimizers(), self.module_class.__name__)

    # -- loss, predictions -----------------------------------------------------------------
    def _on_device(self, model: torch.nn.Module, data: Any) -> Any:
        device = next(model.parameters()).device
        if device.type == "cpu":
            return data
        from lightning.fabric.utilities.apply_func import move_data_to_device

        return move_data_to_device(data, device)

    def loss(self, model: Any, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
        data, count = self._on_device(model, batch["batch"]), len(batch["ids"])
        self.examples = count  # what a self.log without batch_size weighs by
        if model.training:
            output = model.training_step(data, 0)
        else:  # validation's val/loss: the same loss; validation_step logs its own metrics
            with task_metrics.paused():
                output = model.training_step(data, 0)
        loss = output.get("loss") if isinstance(output, Mapping) else output
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise ValueError(f"{self.module_class.__name__}.training_step must return the "
                             f"loss (a scalar tensor) or a dict with 'loss', got "
                             f"{type(output).__name__}")
        return loss * count, count

    @torch.no_grad()
    def predict(self, model: Any, batch: dict[str, Any]) -> list[dict[str, Any]]:
        data, ids = self._on_device(model, batch["batch"]), batch["ids"]
        self.examples = len(ids)
        if overrides(model, "validation_step"):
            model.validation_step(data, 0)  # what it logs: this validation's metrics
        pair = isinstance(data, list | tuple) and len(data) >= 2
        if overrides(model, "predict_step"):
            output = model.predict_step(data, 0)
        else:
            output = model(data[0] if pair else data)
        target = data[1] if pair and isinstance(data[1], torch.Tensor) else None
        if not isinstance(output, torch.Tensor) or output.dim() == 0 or len(output) != len(ids):
            raise ValueError(f"{self.module_class.__name__}: predictions need one output row "
                             f"per example ({len(ids)}); define predict_step(batch, "
                             "batch_idx) returning them")
        if (output.dim() == 2 and target is not None and target.dim() == 1
                and not target.is_floating_point()):
            output = output.argmax(dim=-1)  # a classifier's logits: its class
        targets = target.tolist() if target is not None else [None] * len(ids)
        return [{"id": i, "prediction": p, "target": t}
                for i, p, t in zip(ids, output.tolist(), targets, strict=True)]

    def score(self, records: Sequence[dict[str, Any]]) -> dict[str, float]:
        return {}  # the module's own validation_step logs its scores

    def describe(self, example: dict[str, Any]) -> dict[str, str]:
        item = example["item"]
        parts = item if isinstance(item, list | tuple) else [item]
        return {f"item[{i}]": (f"tensor {list(p.shape)} {p.dtype}" if isinstance(p, torch.Tensor)
                               else repr(p)[:200]) for i, p in enumerate(parts)}

    def control_inputs(self) -> Sequence[dict[str, Any]]:
        val = self.splits()["val"]
        return [val[i] for i in range(min(self.control_count, len(val)))]


def route_logging(module: Any, task: LightningTask) -> None:
    """``self.log`` and ``self.log_dict`` of this module instance into the campaign's task
    metrics (Lightning's own would warn without its Trainer and record nothing), weighed by
    ``batch_size`` or, as Lightning infers it, the microbatch's examples."""

    def log(self: Any, name: str, value: Any, *_: Any, batch_size: int | None = None,
            **__: Any) -> None:
        weight = task.examples if batch_size is None else batch_size
        task_metrics.log_metric(name, value, float(weight))

    def log_dict(self: Any, dictionary: Mapping[str, Any], *_: Any,
                 batch_size: int | None = None, **__: Any) -> None:
        for name, value in dictionary.items():
            log(self, name, value, batch_size=batch_size)

    module.log = types.MethodType(log, module)
    module.log_dict = types.MethodType(log_dict, module)


def parse_optimizers(given: Any, name: str) -> tuple[Any, Any]:
    """(the optimizer, its scheduler or None) of what ``configure_optimizers`` returned, in
    any of Lightning's forms; a ValueError for what the loop cannot step exactly."""
    where = f"task.module: {name}.configure_optimizers()"
    scheduler: Any = None
    if isinstance(given, Mapping):
        optimizer, scheduler = given.get("optimizer"), given.get("lr_scheduler")
    elif isinstance(given, list | tuple):
        if len(given) == 2 and all(isinstance(g, list | tuple) for g in given):
            optimizers, schedulers = list(given[0]), list(given[1])
        else:
            optimizers, schedulers = list(given), []
        if len(optimizers) != 1 or len(schedulers) > 1:
            raise ValueError(f"{where} gives {len(optimizers)} optimizers and "
                             f"{len(schedulers)} schedulers; the campaign's loop steps one "
                             "optimizer (and at most one scheduler)")
        if isinstance(optimizers[0], Mapping):
            return parse_optimizers(optimizers[0], name)
        optimizer, scheduler = optimizers[0], (schedulers[0] if schedulers else None)
    else:
        optimizer = given
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"{where} gives no optimizer ({type(given).__name__}); set "
                         "task.optimizer = 'spec' to use the spec's optimizer.* keys")
    interval = "epoch"  # Lightning's default for a scheduler given without its settings
    if isinstance(scheduler, Mapping):
        interval = str(scheduler.get("interval", "epoch"))
        if int(scheduler.get("frequency", 1)) != 1 or scheduler.get("monitor"):
            raise ValueError(f"{where}: a scheduler stepped every few steps or on a monitored "
                             "metric; the campaign's loop steps it once per update")
        scheduler = scheduler.get("scheduler")
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise ValueError(f"{where}: ReduceLROnPlateau steps on a metric; the campaign's loop "
                         "steps the scheduler once per update")
    if scheduler is not None and interval != "step":
        raise ValueError(f"{where}: the scheduler steps per {interval} (Lightning's default); "
                         "the campaign's loop steps it per update: return {'scheduler': ..., "
                         "'interval': 'step'}")
    return optimizer, scheduler


def _arguments_problem(kind: type, arguments: Mapping[str, Any]) -> str | None:
    """A task key the module's ``__init__`` does not take (with "did you mean"), or one it
    needs that is missing; None when they bind."""
    parameters = dict(inspect.signature(kind.__init__).parameters)
    parameters.pop("self", None)
    open_ended = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    for key in arguments:
        if key not in parameters and not open_ended:
            close = difflib.get_close_matches(key, list(parameters), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            return (f"task.{key}: not an argument of {kind.__name__}.__init__ ({hint}it takes "
                    f"{', '.join(parameters) or 'none'})")
    for key, parameter in parameters.items():
        if (parameter.default is parameter.empty and key not in arguments
                and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)):
            return f"task.{key}: {kind.__name__}.__init__ needs it"
    return None


# What a step may read of Lightning's Trainer, which has no equal here: batch_idx (there are
# no epochs, and it would restart at a resume), the trainer, its step and epoch counters.
READS = ("trainer", "global_step", "current_epoch")


def _reads_problem(kind: type) -> str | None:
    """A step (``training_step``, ``validation_step``, ``configure_optimizers``) whose body
    reads its ``batch_idx`` or ``self.`` one of :data:`READS`, in one line; None otherwise
    (or when its source cannot be read)."""
    import ast
    import textwrap

    for hook in ("training_step", "validation_step", "configure_optimizers"):
        method = getattr(kind, hook, None)
        if method is None or method is getattr(pl.LightningModule, hook, None):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
        except (OSError, TypeError, SyntaxError):  # no source to read: nothing to say
            continue
        function = tree.body[0]
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        arguments = [a.arg for a in function.args.args]
        index = arguments[2] if hook != "configure_optimizers" and len(arguments) > 2 else None
        for node in (n for statement in function.body for n in ast.walk(statement)):
            if index and isinstance(node, ast.Name) and node.id == index:
                return (f"task.module: {kind.__name__}.{hook} reads {index}, which has no "
                        "equal in the campaign's loop (no epochs; a resume would restart it)")
            if (isinstance(node, ast.Attribute) and node.attr in READS
                    and isinstance(node.value, ast.Name) and node.value.id == "self"):
                return (f"task.module: {kind.__name__}.{hook} reads self.{node.attr}; there is "
                        "no Lightning Trainer in the campaign's loop")
    return None


def _spec_optimizer_problem(config: Mapping[str, Any]) -> str | None:
    """With the module's optimizer, a spec that sets optimizer.* or scheduler.* keys would be
    ignored: refused, naming the first."""
    optimizer = config.get("optimizer") or {}
    for key, default in DEFAULT_OPTIMIZER.items():
        if key in optimizer and optimizer[key] != default:
            return (f"optimizer.{key}: configure_optimizers gives the optimizer "
                    "(task.optimizer = 'module'); set task.optimizer = 'spec' to use the "
                    "spec's optimizer.* and scheduler.* keys")
    scheduler = config.get("scheduler") or {}
    if scheduler.get("name", "constant") != "constant" or scheduler.get("warmup"):
        return ("scheduler.name: configure_optimizers gives the schedule (task.optimizer = "
                "'module'); set task.optimizer = 'spec' to use the spec's scheduler.* keys")
    return None
