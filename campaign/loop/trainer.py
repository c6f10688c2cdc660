"""The training engine shared by runs and the pilot: one ``Trainer`` per configuration.

What a run records around it (ledger, stop rules, checkpoints on disk,
heartbeat) lives in ``loop.train``; what the pilot checks around it lives in
``pilot``. Both drive the same methods, so a gate that passes in the pilot
passed on the code the runs execute. The inner update, read top to bottom:

    batches = trainer.batches(trainer.next_examples())
    loss_sum, units = trainer.forward_backward(batches)   # exact over the effective batch
    grad_norm = trainer.gradient_norm()                  # unscale, clip
    trainer.step()                                       # optimizer, scaler, scheduler

Exact normalisation: the task returns the *sum* of per-unit losses and the
number of units; sums are backpropagated and the gradients divided by the
units of the whole effective batch, so accumulation, padding, variable
lengths, data replicas and an incomplete last batch give one big batch's
gradient. Mixed precision: bf16 autocast, or fp16 autocast with a GradScaler
whose update follows the optimizer step of the effective batch.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint as activation_checkpoint

from campaign.errors import LoopError
from campaign.loop import checkpoint as ckpt
from campaign.loop import model_state, progress_page, shard_files, sharding
from campaign.loop import replicas as dp
from campaign.loop.data import to_device
from campaign.loop.loader import Feeder
from campaign.loop.optim import build_optimizer, build_scheduler, schedules, task_optimizer
from campaign.loop.task import Batch, Example, TaskContract, check_records
from campaign.loop.task_order import make_order

PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
NO_UNITS = "an effective batch with no loss units (every target masked out)"


def seed_everything(seed: int) -> None:
    """Python's, numpy's and torch's generators from ``seed``. Without an accelerator only
    torch's CPU generator, all that ``torch.manual_seed`` seeds there: it also queues a seed
    for each device kind that might start later, with a formatted stack of the caller (9 ms a
    run, for devices that cannot start in a process that has none)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    if torch.accelerator.is_available():
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)


@dataclass(frozen=True)
class SeededSplits:
    """A task's splits made as a trainer makes them (the run's seed, then ``splits()``), with
    the generators' states that ``splits()`` left. A trainer given them takes those states on
    and builds its model from the same random state as one that asks the task itself, so a
    ``splits()`` that draws (toy data from ``torch.randn``, on CUDA too) changes nothing.
    The pilot asks once for its data gate and every session: a lazy dataset's objects are
    then the same, and its gate sample is read once."""

    seed: int
    splits: Mapping[str, Any]
    generators: tuple[Any, ...]

    @classmethod
    def of(cls, task: TaskContract, seed: int) -> SeededSplits:
        seed_everything(seed)
        splits = task.splits()
        # CUDA's generators only if splits() started CUDA: otherwise they are as seeded
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        return cls(seed, splits, (random.getstate(), np.random.get_state(),
                                  torch.get_rng_state(), cuda))

    def take(self, seed: int) -> Mapping[str, Any] | None:
        """The splits, every generator left as ``splits()`` left it (None: made for another
        seed, so the trainer asks the task itself)."""
        if seed != self.seed:
            return None
        python, numpy, cpu, cuda = self.generators
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        return self.splits


class Trainer:
    """Model, optimizer, scheduler, scaler and data order of one resolved config, and the step.

    Built in the order a resume relies on: seed, data, model (activation
    checkpointing), optimizer, scheduler, scaler, data order.
    """

    def __init__(
        self,
        task: TaskContract,
        config: Mapping[str, Any],
        device: torch.device,
        replica: dp.Replica | None = None,
        splits: SeededSplits | None = None,
    ) -> None:
        loop = config["loop"]
        self.task, self.config, self.device = task, config, device
        self.replica = replica or dp.Replica(0, 1)
        self.seed = int(config.get("seed", 0))
        seed_everything(self.seed)
        # ``splits``: the task's, already asked for right after this same seeding (the pilot)
        given = splits.take(self.seed) if splits is not None else None
        data = task.splits() if given is None else given
        # Any sized, indexable dataset (a list, a Sequence, a torch Dataset): never materialised.
        self.train_set: Sequence[Example] = data["train"]
        self.val_set: Sequence[Example] = data["val"]
        built = task.model()
        # An adapter on a frozen base saves only what trains; the base is named and hashed as
        # built, before any device move (a replay on the CPU hashes the same bytes).
        self.base = model_state.base_record(built, task)
        self.model = built.to(device)
        if loop["activation_checkpointing"]:  # the model's own (a task says how), or ours
            own = getattr(task, "enable_activation_checkpointing", None)
            if callable(own):
                own(self.model)
            else:
                checkpoint_blocks(self.model, loop.get("checkpoint_modules") or "blocks")
        # loop.strategy = "fsdp": sharded across the ranks, before the optimizer sees the params
        self.sharding = (sharding.shard(self.model, task, loop, device, self.replica)
                         if loop.get("strategy") == "fsdp" and self.replica.world > 1 else None)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        # The task's own optimizer (a LightningModule's configure_optimizers), else the spec's;
        # ``optimizer_source`` says which, for the run's events, when the task could give one.
        own = task_optimizer(task, self.model)
        self.optimizer_source = None if own is None else own[2]
        if own is None or own[0] is None:
            self.optimizer = build_optimizer(self.model, config["optimizer"])
            self.scheduler = build_scheduler(self.optimizer, config)
            # A constant rate without warmup never changes: the scheduler step is skipped.
            self.schedules = schedules(config)
        else:
            self.optimizer, scheduler = own[0], own[1]
            self.scheduler = scheduler or torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda _: 1.0)
            self.schedules = scheduler is not None
        self.scaler = torch.amp.GradScaler(device.type, enabled=loop["precision"] == "fp16")
        self.dtype = PRECISION_DTYPES.get(loop["precision"])
        self.microbatch = int(loop["microbatch"])
        self.per_update = self.microbatch * loop["accumulation"] * loop["replicas"]
        validation = config.get("validation") or {}
        self.val_batch = int(validation.get("microbatch") or self.microbatch * loop["accumulation"])
        # What validation reads: the split, or a fixed seeded sample of it (validation.sample);
        # and a fixed sample of the training split to estimate its loss (validation.train_sample)
        self.val_view = fixed_sample(self.val_set, validation.get("sample"))
        train_sample = validation.get("train_sample")
        self.train_view = fixed_sample(self.train_set, train_sample) if train_sample else None
        self.clip: float | None = loop["clip_grad_norm"]
        self.order = make_order(task, len(self.train_set), self.seed, self.per_update, loop)
        self._single_group = len({(p.device, p.dtype) for p in self.trainable}) == 1
        self.feeder: Feeder | None = None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16/fp16 autocast as configured; a no-op context in fp32."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def next_examples(self) -> list[Example]:
        """The examples of the next update, in the run's data order."""
        return [self.train_set[i] for i in self.order.next_update()]

    def next_update(self) -> tuple[int, list[Batch], float]:
        """The next update as the loop takes it: its number of examples (every replica's),
        this replica's microbatches on the device (prepared by the loader, ``loop.
        loader_workers`` processes or this one), and the seconds spent waiting for them."""
        if self.feeder is None:  # started where the run is (after a resume: its checkpoint's)
            loop = self.config["loop"]
            self.feeder = Feeder(
                self.train_set, self.task, self.order, seed=self.seed,
                microbatch=self.microbatch, replica=self.replica,
                workers=int(loop.get("loader_workers", 0)), prefetch=int(loop.get("prefetch", 2)),
                pin_memory=bool(loop.get("pin_memory")) and self.device.type == "cuda",
            )
        count = len(self.order.next_update())  # the run's position, as checkpoints save it
        batches, waited = self.feeder.next()
        blocking = not (self.device.type == "cuda" and self.config["loop"].get("pin_memory"))
        return count, [to_device(b, self.device, blocking) for b in batches], waited

    def close(self) -> None:
        """Stop the loader's workers."""
        if self.feeder is not None:
            self.feeder.close()
            self.feeder = None

    def batches(self, examples: Sequence[Example]) -> list[Batch]:
        """Microbatches of ``examples`` (this replica's share), collated and on the device."""
        chunks = [
            examples[i : i + self.microbatch] for i in range(0, len(examples), self.microbatch)
        ]
        if self.replica.world > 1:
            chunks = dp.share(chunks, self.replica)
        return [to_device(self.task.collate(list(chunk)), self.device) for chunk in chunks]

    def forward_backward(self, batches: Sequence[Batch]) -> tuple[float, int]:
        """Train mode, fresh gradients, then the effective batch's (loss sum, units).

        The gradients left on the parameters are those of (loss sum / units)
        over the whole effective batch (every replica's share included).
        """
        if not self.model.training:  # train() walks every module: only when needed
            self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        if self.sharding is not None:
            return sharding.accumulate_sharded(self.task, self.model, batches, self._filler,
                                               self.autocast())
        if self.replica.world > 1:
            return dp.accumulate_across(
                self.task, self.model, batches, self.replica, self.autocast()
            )
        scaler = self.scaler if self.scaler.is_enabled() else None
        return accumulate(self.task, self.model, batches, scaler=scaler, autocast=self.autocast())

    def gradient_norm(self) -> float:
        """Unscale (fp16), clip to ``loop.clip_grad_norm`` when set; the total gradient norm.

        Without clipping, the fused per-tensor norms are combined directly:
        ``get_total_norm`` first regroups tensors by device and dtype in Python,
        which costs more than the norms on a small model.
        """
        self.scaler.unscale_(self.optimizer)
        if self.sharding is not None:  # every rank's shards (a collective)
            return sharding.gradient_norm(self.trainable, self.clip)
        if self.clip is not None:
            return float(torch.nn.utils.clip_grad_norm_(self.trainable, self.clip))
        grads = [p.grad for p in self.trainable if p.grad is not None]
        if not grads:
            return 0.0
        if self._single_group:
            return float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))))
        return float(torch.nn.utils.get_total_norm(grads))

    def _filler(self) -> Batch:
        """A batch for a sharded rank whose share of an update is empty (weighted zero)."""
        return to_device(self.task.collate([self.train_set[0]]), self.device)

    def step(self) -> None:
        """The optimizer step (through the scaler with fp16, updated once per effective batch),
        then the scheduler's."""
        if self.scaler.is_enabled():
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.schedules:
            self.scheduler.step()

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def evaluate(
        self, examples: Sequence[Example], batch_size: int
    ) -> tuple[float, int, list[dict[str, Any]]]:
        """Validation over ``examples``: eval mode, no gradients; (loss sum, units, predictions)."""
        try:
            return evaluate(self.task, self.model, examples, batch_size, self.device,
                            self.autocast)
        finally:
            if self.sharding is not None:  # FSDP2 leaves the root's parameters gathered after
                # a forward without backward; the next update's gradients were then wrong (a
                # gradient norm of 41 for 1.10, tests/loop/test_sharded.py): shard them again
                self.model.reshard()  # type: ignore[operator]

    def train_estimate(self) -> dict[str, float]:
        """``train_eval/loss`` and ``train_eval/<score>`` on the fixed training sample (eval
        mode, no gradients), or nothing when ``validation.train_sample`` is not set."""
        if self.train_view is None:
            return {}
        total, units, records = self.evaluate(self.train_view, self.val_batch)
        scores = {f"train_eval/{k}": float(v) for k, v in self.task.score(records).items()}
        return {**scores, "train_eval/loss": total / max(1, units)}

    def capture_state(self, **extra: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Everything a resume needs, as (tensors, JSON document) for a checkpoint file; a
        sharded run's tensors are this rank's shards (their full shapes under ``sharded``)."""
        tensors: dict[str, torch.Tensor] = {}
        state = {
            "model": ckpt.split_state("model", model_state.saved_state(self.model, self.task),
                                      tensors),
            "base": self.base,
            "optimizer": ckpt.split_state("optimizer", self.optimizer.state_dict(), tensors),
            "scheduler": ckpt.split_state("scheduler", self.scheduler.state_dict(), tensors),
            "scaler": self.scaler.state_dict(),
            "rng": ckpt.rng_state(tensors),
            "data": self.order.state(),
            **extra,
        }
        if self.sharding is not None:
            state["sharded"] = shard_files.localise(tensors)
        return tensors, state

    def restore_state(self, tensors: Mapping[str, torch.Tensor], state: Mapping[str, Any]) -> None:
        """The inverse of :meth:`capture_state` (RNG states and data position included)."""
        saved = shard_files.model_layout(ckpt.join_state(state["model"], tensors), self.model)
        model_state.load_saved_state(self.model, saved, self.task, state.get("base"),
                                     "the checkpoint")
        optimizer = ckpt.join_state(state["optimizer"], tensors)
        self.optimizer.load_state_dict(shard_files.optimizer_layout(optimizer, self.optimizer))
        self.scheduler.load_state_dict(ckpt.join_state(state["scheduler"], tensors))
        self.scaler.load_state_dict(state["scaler"])
        ckpt.restore_rng(state["rng"], tensors)
        self.order.restore(state["data"])
        self.close()  # a loader already started walks the old position: the next starts anew


def accumulate(
    task: TaskContract,
    model: torch.nn.Module,
    batches: Sequence[Batch],
    *,
    scaler: torch.amp.GradScaler | None = None,
    autocast: contextlib.AbstractContextManager[Any] | None = None,
) -> tuple[float, int]:
    """Backpropagate every microbatch's loss *sum*, then divide the gradients by all units.

    Returns (loss sum, units) of the effective batch: exactly one big batch's
    gradients, whatever the split into microbatches.
    """
    context = autocast if autocast is not None else contextlib.nullcontext()
    if len(batches) == 1 and scaler is None:
        # One microbatch: its units are known before the backward, so the loss
        # can be normalised first and the extra pass over the gradients saved.
        progress_page.tick("forward")  # a supervisor names the phase a hang is in
        with context:
            loss_sum, count = task.loss(model, batches[0])
        _check_units(count)
        if int(count) == 0:
            raise LoopError(NO_UNITS)
        progress_page.tick("backward")
        (loss_sum / count).backward()
        return float(loss_sum.detach()), int(count)
    total = torch.zeros((), dtype=torch.float64)
    units = 0
    for batch in batches:
        progress_page.tick("forward")  # a supervisor names the phase a hang is in
        with context:
            loss_sum, count = task.loss(model, batch)
        _check_units(count)
        progress_page.tick("backward")
        (scaler.scale(loss_sum) if scaler is not None else loss_sum).backward()
        total += loss_sum.detach().to(torch.float64).cpu()
        units += int(count)
    if units == 0:
        raise LoopError(NO_UNITS)
    for parameter in model.parameters():
        if parameter.grad is not None:
            parameter.grad.div_(units)
    return float(total), units


def _check_units(count: Any) -> None:
    """``loss()`` counts units: a negative count would turn the normalised loss upside down
    (the optimiser would climb it and the run end ``completed``)."""
    if int(count) < 0:
        raise LoopError(f"loss() returned {int(count)} units: a number of units is never negative")


@torch.no_grad()
def evaluate(
    task: TaskContract,
    model: torch.nn.Module,
    examples: Sequence[Example],
    batch_size: int,
    device: torch.device,
    autocast: Any = contextlib.nullcontext,
) -> tuple[float, int, list[dict[str, Any]]]:
    """Validation: eval mode, no gradients, loss over all units and every prediction.

    The model is back in train mode afterwards, whatever happens inside.
    """
    model.eval()
    total, units, records = 0.0, 0, []
    try:
        for start in range(0, len(examples), batch_size):
            progress_page.tick()
            chunk = [examples[i] for i in range(start, min(start + batch_size, len(examples)))]
            batch = to_device(task.collate(chunk), device)
            with autocast():
                loss_sum, count = task.loss(model, batch)
            _check_units(count)
            total += float(loss_sum)
            units += int(count)
            records.extend(check_records(task.predict(model, batch)))
    finally:
        model.train()
    return total, units, records


def fixed_sample(dataset: Any, count: int | None, seed: int = 0) -> Any:
    """``dataset`` itself, or a fixed seeded sample of ``count`` of its examples (in index
    order; the same whatever the run's seed, so every run validates on the same examples)."""
    if count is None or count >= len(dataset):
        return dataset
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(len(dataset), generator=generator, dtype=torch.int32)[:count]
    return torch.utils.data.Subset(dataset, sorted(chosen.tolist()))


def checkpoint_blocks(model: torch.nn.Module, path: str = "blocks") -> None:
    """Wrap each module of the module list at ``path`` (``loop.checkpoint_modules``: ``blocks``
    by default, ``transformer.h`` for nanoGPT's GPT) with activation checkpointing."""
    try:
        blocks = model.get_submodule(path)
    except AttributeError:
        blocks = None
    if not isinstance(blocks, torch.nn.ModuleList | torch.nn.Sequential):
        raise LoopError(f"loop.activation_checkpointing: loop.checkpoint_modules = {path!r} is "
                        "not a ModuleList of the model (name the list of blocks, e.g. "
                        "'transformer.h')")
    for block in blocks:
        forward = block.forward

        def checkpointed(*args: Any, _forward: Any = forward, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return _forward(*args, **kwargs)
            return activation_checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = checkpointed  # type: ignore[method-assign]
