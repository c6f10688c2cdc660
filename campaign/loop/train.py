"""The controlled loop: one run of a resolved config, recorded into the ledger.

``RunLoop`` follows torchtune's recipe shape: ``setup`` / ``train`` /
``save_checkpoint`` / ``cleanup``, invalid option combinations refused in
``__init__`` before any work. Features and their trade-offs:

- Exact normalisation: the task returns the *sum* of per-unit losses and the
  number of units; the loop backpropagates sums and divides the gradients by
  the units of the whole effective batch, so accumulation, padding, variable
  lengths and an incomplete last batch give the gradient of one big batch
  (one extra pass over the gradients per update).
- Mixed precision: bf16 autocast; fp16 autocast with a GradScaler whose
  update follows the optimizer step of the effective batch. On CPU autocast
  is a no-op unless asked for.
- Activation checkpointing of the model's ``blocks`` (less memory, one more
  forward per block in the backward pass).
- Metrics every update through the buffered ledger writer; the loss is read
  back from the device once per update (``float()`` is a host sync).
- Phase measurements on the first update (optimizer state allocation), the
  second, the first validation, checkpoints, and then every
  ``measure_every`` updates: cheap enough to leave on.
- Checkpoints at every validation (or ``loop.checkpoint_every``) and at the
  stop, written atomically; a resume continues the same run id in a new
  segment and compares the steps it replays with the values first logged.
- SIGTERM/SIGINT: finish the current update, checkpoint, end ``interrupted``.
- Leases: every write carries the lease of the claim that started this
  segment. A heartbeat thread stamps the run; when a heartbeat finds the
  lease gone (the run was declared lost and perhaps reclaimed), the loop
  stops after the current update and writes nothing more (:class:`LeaseLost`
  propagates to whoever placed the run). Checkpoint and prediction files are
  named by segment, so a stale worker cannot overwrite its successor's files.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import random
import signal
import socket
import threading
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch.utils.checkpoint import checkpoint as activation_checkpoint

from campaign.ledger import Claim, Ledger, StopInfo
from campaign.ledger.canonical import canonical_json
from campaign.ledger.errors import LeaseLost
from campaign.loop import checkpoint as ckpt
from campaign.loop import replicas as dp
from campaign.loop.measure import Probe
from campaign.loop.stop import Stop, StopRules
from campaign.loop.task import Batch, Task, build_task

PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class LoopError(ValueError):
    """A run that cannot be executed as configured (said before any work)."""


@dataclass(frozen=True)
class Outcome:
    run_id: str
    status: str
    cause: str
    step: int
    detail: str


# -- the pieces that tests and the pilot use directly ------------------------------------


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def to_device(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def accumulate(
    task: Task,
    model: torch.nn.Module,
    batches: Sequence[Batch],
    *,
    scaler: torch.amp.GradScaler | None = None,
    autocast: contextlib.AbstractContextManager[Any] | None = None,
) -> tuple[float, int]:
    """Backpropagate every microbatch's loss *sum*, then divide the gradients by all units.

    Returns (loss sum, units) of the effective batch. The gradients left on
    the parameters are those of (total loss sum / total units): exactly one
    big batch's, whatever the split into microbatches.
    """
    if len(batches) == 1 and scaler is None:
        # One microbatch: its units are known before the backward, so the loss
        # can be normalised first and the extra pass over the gradients saved.
        with autocast if autocast is not None else contextlib.nullcontext():
            loss_sum, count = task.loss(model, batches[0])
        if int(count) == 0:
            raise LoopError("an effective batch with no loss units (every target masked out)")
        (loss_sum / count).backward()
        return float(loss_sum.detach()), int(count)
    total = torch.zeros((), dtype=torch.float64)
    units = 0
    for batch in batches:
        with autocast if autocast is not None else contextlib.nullcontext():
            loss_sum, count = task.loss(model, batch)
        (scaler.scale(loss_sum) if scaler is not None else loss_sum).backward()
        total += loss_sum.detach().to(torch.float64).cpu()
        units += int(count)
    if units == 0:
        raise LoopError("an effective batch with no loss units (every target masked out)")
    for parameter in model.parameters():
        if parameter.grad is not None:
            parameter.grad.div_(units)
    return float(total), units


def optimizer_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
    """Step the optimizer; with fp16 through the scaler, updated once per effective batch."""
    if scaler.is_enabled():
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()


def build_optimizer(model: torch.nn.Module, config: Mapping[str, Any]) -> torch.optim.Optimizer:
    options = config["optimizer"]
    parameters = [p for p in model.parameters() if p.requires_grad]
    if options["name"] == "sgd":
        return torch.optim.SGD(
            parameters,
            lr=options["lr"],
            momentum=options["momentum"],
            weight_decay=options["weight_decay"],
        )
    return torch.optim.AdamW(
        parameters,
        lr=options["lr"],
        weight_decay=options["weight_decay"],
        betas=(options["beta1"], options["beta2"]),
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: Mapping[str, Any]
) -> torch.optim.lr_scheduler.LambdaLR:
    """constant, linear_warmup (then constant) or cosine (after the warmup) as LR factors."""
    name = config["scheduler"]["name"]
    warmup = int(config["scheduler"]["warmup"])
    total = int(config["budget"]["updates"])

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if name == "cosine":
            progress = (step - warmup) / max(1, total - warmup)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def checkpoint_blocks(model: torch.nn.Module) -> None:
    """Wrap each module of ``model.blocks`` with activation checkpointing."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, torch.nn.ModuleList):
        raise LoopError("loop.activation_checkpointing needs a model with a `blocks` ModuleList")
    for block in blocks:
        forward = block.forward

        def checkpointed(*args: Any, _forward: Any = forward, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return _forward(*args, **kwargs)
            return activation_checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = checkpointed  # type: ignore[method-assign]


def environment(task_reference: str) -> dict[str, Any]:
    """The software stack of this process, recorded with the run."""
    import importlib.metadata as metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    cuda = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if cuda
        else ["cpu"],
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "task": task_reference,
        "git_revision": _git_revision(task_reference),
        "packages": {
            n: version(n)
            for n in ("campaign", "numpy", "safetensors", "sqlalchemy", "pandas", "scikit-learn")
        },
    }


def _git_revision(task_reference: str) -> str | None:
    import importlib
    import subprocess

    try:
        module = importlib.import_module(task_reference.partition(":")[0])
        folder = Path(module.__file__ or ".").resolve().parent
        done = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        return done.stdout.strip() or None if done.returncode == 0 else None
    except Exception:  # no git, not a repository, no file: the revision is unknown
        return None


@torch.no_grad()
def evaluate(
    task: Task,
    model: torch.nn.Module,
    examples: Sequence[dict[str, Any]],
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
            batch = to_device(task.collate(examples[start : start + batch_size]), device)
            with autocast():
                loss_sum, count = task.loss(model, batch)
            total += float(loss_sum)
            units += int(count)
            records.extend(task.predict(model, batch))
    finally:
        model.train()
    return total, units, records


def capture_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
    order: DataOrder,
    **extra: Any,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Everything a resume needs, as (tensors, JSON document) for a checkpoint file."""
    tensors: dict[str, torch.Tensor] = {}
    state = {
        "model": ckpt.split_state("model", model.state_dict(), tensors),
        "optimizer": ckpt.split_state("optimizer", optimizer.state_dict(), tensors),
        "scheduler": ckpt.split_state("scheduler", scheduler.state_dict(), tensors),
        "scaler": scaler.state_dict(),
        "rng": ckpt.rng_state(tensors),
        "data": order.state(),
        **extra,
    }
    return tensors, state


def restore_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
    order: DataOrder,
    tensors: Mapping[str, torch.Tensor],
    state: Mapping[str, Any],
) -> None:
    model.load_state_dict(ckpt.join_state(state["model"], tensors))
    optimizer.load_state_dict(ckpt.join_state(state["optimizer"], tensors))
    scheduler.load_state_dict(ckpt.join_state(state["scheduler"], tensors))
    scaler.load_state_dict(state["scaler"])
    ckpt.restore_rng(state["rng"], tensors)
    order.restore(state["data"])


@dataclass
class TrainingParts:
    """What one configuration trains with; built the same way for runs and the pilot."""

    train_set: list[dict[str, Any]]
    val_set: list[dict[str, Any]]
    model: torch.nn.Module
    trainable: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    dtype: torch.dtype | None
    per_update: int
    order: DataOrder


def build_parts(task: Task, config: Mapping[str, Any], device: torch.device) -> TrainingParts:
    """Seed, then data, model (with activation checkpointing), optimizer, scheduler, scaler."""
    seed = int(config.get("seed", 0))
    seed_everything(seed)
    data = task.splits()
    train_set, val_set = list(data["train"]), list(data["val"])
    model = task.model().to(device)
    loop = config["loop"]
    if loop["activation_checkpointing"]:
        checkpoint_blocks(model)
    optimizer = build_optimizer(model, config)
    per_update = loop["microbatch"] * loop["accumulation"] * loop["replicas"]
    return TrainingParts(
        train_set=train_set,
        val_set=val_set,
        model=model,
        trainable=[p for p in model.parameters() if p.requires_grad],
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, config),
        scaler=torch.amp.GradScaler(device.type, enabled=loop["precision"] == "fp16"),
        dtype=PRECISION_DTYPES.get(loop["precision"]),
        per_update=per_update,
        order=DataOrder(len(train_set), seed, per_update, loop["last_batch"]),
    )


# -- data order -----------------------------------------------------------------------


class DataOrder:
    """A reshuffle per epoch from (seed, epoch); the position is (epoch, cursor)."""

    def __init__(self, size: int, seed: int, per_update: int, last_batch: str) -> None:
        self.size, self.seed, self.per_update, self.last_batch = size, seed, per_update, last_batch
        self.epoch, self.cursor = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.size, generator=generator).tolist()

    def next_update(self) -> list[int]:
        remaining = self.size - self.cursor
        if remaining == 0 or (self.last_batch == "drop" and remaining < self.per_update):
            self.epoch, self.cursor = self.epoch + 1, 0
            self._order = self._permutation(self.epoch)
        indices = self._order[self.cursor : self.cursor + self.per_update]
        self.cursor += len(indices)
        return indices

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def restore(self, state: Mapping[str, int]) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._permutation(self.epoch)


# -- the loop --------------------------------------------------------------------------


class RunLoop:
    """Executes one planned (or resumable) run; see the module docstring for the features."""

    def __init__(
        self,
        ledger: Ledger,
        run_id: str,
        *,
        artifacts: Path,
        worker: str | None = None,
        device: str = "cpu",
        heartbeat_s: float = 30.0,
        measure_every: int = 100,
        replay_in_subprocess: bool = True,
        claim: Claim | None = None,
        preempt_signals: Sequence[int] = (),
        replica: dp.Replica | None = None,
    ) -> None:
        self.ledger = ledger
        self.record = ledger.run(run_id)
        self.run_id = run_id
        self.config = self.record.config_document
        self.device = torch.device(device)
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}:{device}"
        self.folder = Path(artifacts) / run_id
        self.heartbeat_s = heartbeat_s
        self.measure_every = measure_every
        self.replay_in_subprocess = replay_in_subprocess
        loop = self.config["loop"]
        self.replica = replica or dp.Replica(0, 1)
        self.writes = self.replica.leader  # only rank 0 writes to the ledger and artifacts
        if loop["replicas"] != self.replica.world:
            raise LoopError(
                f"run {run_id}: loop.replicas = {loop['replicas']} needs that many processes: "
                "run it through `campaign worker` or `campaign launch` (`campaign run` and "
                "`campaign resume` execute one process)"
            )
        if loop["replicas"] > 1 and loop["precision"] == "fp16":
            raise LoopError(f"run {run_id}: fp16 with replicas is not supported (use bf16)")
        if loop["precision"] == "fp16" and self.device.type == "cpu":
            raise LoopError(f"run {run_id}: fp16 with a GradScaler needs a CUDA device")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise LoopError(f"run {run_id}: device {device} requested, but CUDA is unavailable")
        if claim is not None and (claim.run_id != run_id or self.record.status != "running"):
            raise LoopError(f"run {run_id}: the claim given does not hold this run")
        self._claim = claim
        self.lease: str | None = claim.lease if claim is not None else None
        self._lease_lost = threading.Event()
        self._signal: int | None = None
        self.preempt_signals = tuple(preempt_signals)
        self._previous_handlers: dict[int, Any] = {}
        self._stop_heartbeat = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self.phase = "setup"
        self._batches: list[Batch] = []
        self.step, self.examples_seen = 0, 0
        self._pending: list[list[Any]] = []  # unflushed metric points of a resumed checkpoint
        self._validated = False

    # -- setup ---------------------------------------------------------------------

    def setup(self) -> None:
        """Take the run (unless a worker's claim already did), then build everything."""
        if not self.writes:
            self._follow_leader()
            return
        resume_from = (
            self._latest_checkpoint() if self.record.status in ("interrupted", "lost") else None
        )
        claim = self._claim
        if claim is None:
            claim = self.ledger.start(
                self.run_id,
                self.worker,
                start_step=resume_from["step"] if resume_from else 0,
                resumed_from=resume_from["id"] if resume_from else None,
            )
        self.segment_id, self.segment_ordinal, self.lease = (
            claim.segment_id,
            claim.ordinal,
            claim.lease or None,
        )
        self._start_heartbeat()  # from the claim on: building the model may take a while
        if self.replica.world > 1:
            dp.broadcast_json({"resume_from": resume_from}, self.replica, self._group_device)
        try:
            self._prepare(resume_from)
        except Exception as error:  # the run left `planned`: it must end with a stop cause
            artifact = self._save_traceback()
            detail = f"{type(error).__name__}: {_first_line(error)}"
            if artifact:
                detail += f" (traceback: artifact {artifact})"
            self.ledger.finish(
                self.run_id,
                "failed",
                StopInfo("exception", self.step, self.phase, detail),
                lease=self.lease,
            )
            raise LoopError(f"run {self.run_id} failed in {self.phase}: {detail}") from error

    @property
    def _group_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def _follow_leader(self) -> None:
        """A non-zero rank: rank 0 claimed the run; learn from it where training starts."""
        self.segment_id, self.segment_ordinal, self.lease = None, 0, None
        shared = dp.broadcast_json(None, self.replica, self._group_device)
        self._prepare(shared["resume_from"])

    def _prepare(self, resume_from: Mapping[str, Any] | None) -> None:
        if self.writes:
            self.ledger.set_environment(
                self.run_id, environment(self._task_reference()), lease=self.lease
            )
        self.seed = int(self.config["seed"])
        seed_everything(self.seed)
        self.task = build_task(self._task_reference(), json.loads(json.dumps(self.config)))
        parts = build_parts(self.task, self.config, self.device)
        self.train_set, self.val_set, self.model = parts.train_set, parts.val_set, parts.model
        self.trainable = parts.trainable
        self.single_group = len({(p.device, p.dtype) for p in self.trainable}) == 1
        self.optimizer, self.scheduler, self.scaler = parts.optimizer, parts.scheduler, parts.scaler
        scheduler = self.config["scheduler"]
        # A constant rate without warmup never changes: skip the per-update step.
        self.schedule = scheduler["name"] != "constant" or scheduler["warmup"] > 0
        self.autocast_dtype, self.per_update, self.order = (
            parts.dtype,
            parts.per_update,
            parts.order,
        )
        self.rules = StopRules(self.config)
        self.step, self.examples_seen = 0, 0
        self.replayed_from: int | None = None
        if resume_from:
            self._restore(resume_from)
        self.metrics: Any = (
            self.ledger.metric_writer(self.run_id, self.segment_id, lease=self.lease)
            if self.writes
            else DiscardedMetrics()
        )
        for key, step, value, seen, wall in self._pending:
            self.metrics.log(key, step, float("nan") if value is None else value, seen, wall)
        self.probe = Probe(self.device)
        self._install_signal_handlers()

    def _task_reference(self) -> str:
        return self.ledger.campaign(self.record.campaign).task

    # -- training ------------------------------------------------------------------

    def train(self) -> Outcome:
        stop: Stop | None = None
        detail_artifact = None
        try:
            stop = self._loop()
        except LeaseLost:
            raise  # another worker may own the run now: write nothing more
        except torch.cuda.OutOfMemoryError as error:
            stop = Stop(
                "oom",
                "out_of_memory",
                f"{_first_line(error)} in {self.phase} with inputs "
                f"{canonical_json(self.phase_inputs)}",
            )
        except Exception as error:
            detail_artifact = self._save_traceback()
            stop = Stop("failed", "exception", f"{type(error).__name__}: {_first_line(error)}")
        return self._end(stop, detail_artifact)

    def _loop(self) -> Stop:
        every = int(self.config["validation"]["every"])
        checkpoint_every = self.config["loop"]["checkpoint_every"] or every
        while True:
            stop = self._update()
            if stop is not None:
                return stop
            if self.step % every == 0:
                stop = self._validate()
                if stop is not None:
                    return stop
            if self.step % checkpoint_every == 0:
                self.save_checkpoint()
            stop = self.rules.after_update(self.step)
            if self.replica.world > 1:
                stop = self._agree(stop)
            if self._lease_lost.is_set():
                raise LeaseLost(
                    f"run {self.run_id}: heartbeat refused, the lease is gone (declared lost or "
                    "taken by another worker); this worker stops without writing"
                )
            if self._signal is not None:
                name = signal.Signals(self._signal).name
                if self._signal in self.preempt_signals:
                    detail = f"{name} received: the scheduler preempts or times out the job"
                    return Stop("interrupted", "preempted", detail, "update")
                return Stop("interrupted", "interrupted", f"{name} received", "update")
            if stop is not None:
                if stop.cause == "budget_reached" and self.step % every != 0:
                    stop = self._validate() or stop  # always end with a validation point
                return replace(stop, phase=stop.phase or "update")

    def _agree(self, stop: Stop | None) -> Stop | None:
        """Every rank takes the same decision after each update (one small all-reduce): a
        signal, a lost lease or a stop rule on any rank stops all of them."""
        flags = torch.tensor(
            [self._signal is not None, self._lease_lost.is_set(), stop is not None],
            dtype=torch.float64,
            device=self._group_device,
        )
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        signalled, lease_lost, stopping = (bool(v) for v in flags.tolist())
        if signalled and self._signal is None:
            self._signal = signal.SIGTERM
        if lease_lost:
            self._lease_lost.set()
        if stopping and stop is None:  # e.g. the wall-time rule fired on another rank first
            stop = Stop("stopped", "wall_time", "stopped together with another replica")
        return stop

    def _measured(self) -> bool:
        return self.step < 2 or self.step % self.measure_every == 0

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _update(self) -> Stop | None:
        measure = self._measured()
        loop = self.config["loop"]
        self.phase, self._batches = "data", []
        with self.probe.phase("data", measure=measure) as record:
            indices = self.order.next_update()
            chunks = [
                indices[i : i + loop["microbatch"]]
                for i in range(0, len(indices), loop["microbatch"])
            ]
            if self.replica.world > 1:
                chunks = dp.share(chunks, self.replica)
            batches = [
                to_device(self.task.collate([self.train_set[i] for i in c]), self.device)
                for c in chunks
            ]
            self._batches = batches
            if record is not None:
                record.inputs = self.phase_inputs
        if not self.model.training:  # train() walks every module: only when needed
            self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        self.phase = "forward"
        with self.probe.phase("backward", self.phase_inputs if measure else None, measure=measure):
            if self.replica.world > 1:
                loss_sum, units = dp.accumulate_across(
                    self.task, self.model, batches, self.replica, self._autocast()
                )
            else:
                loss_sum, units = accumulate(
                    self.task,
                    self.model,
                    batches,
                    scaler=self.scaler if self.scaler.is_enabled() else None,
                    autocast=self._autocast(),
                )
        loss = loss_sum / units
        stop = self.rules.after_loss(loss)
        if stop is not None:  # the diverged curve keeps its last point
            self.metrics.log("train/loss", self.step + 1, loss, self.examples_seen + len(indices))
            return replace(stop, phase="forward", step=self.step + 1)
        self.phase = "update"
        name = "update" if self.step > 0 else "update_first"
        with self.probe.phase(name, self.phase_inputs if measure else None, measure=measure):
            self.scaler.unscale_(self.optimizer)
            grad_norm = self._gradient_norm(loop["clip_grad_norm"])
            if not self.scaler.is_enabled():
                stop = self.rules.after_gradients(grad_norm)
                if stop is not None:
                    self.metrics.log("train/loss", self.step + 1, loss, self.examples_seen)
                    return replace(stop, phase="backward", step=self.step + 1)
            optimizer_step(self.optimizer, self.scaler)
            if self.schedule:
                self.scheduler.step()
        self.step += 1
        self.examples_seen += len(indices)
        self.metrics.log_dict(
            self.step,
            {
                "train/loss": loss,
                "train/grad_norm": grad_norm,
                "train/units": float(units),
                "train/lr": self.optimizer.param_groups[0]["lr"],
            },
            self.examples_seen,
        )
        self._write_phases()
        return None

    @property
    def phase_inputs(self) -> dict[str, Any]:
        """What the current update works on (shapes, longest length, microbatch); computed
        only when a measurement or an out-of-memory report needs it."""
        if not self._batches:
            return {}
        return describe_inputs(self._batches, self.config["loop"]["microbatch"])

    def _gradient_norm(self, clip: float | None) -> float:
        """The total gradient norm (clipping to ``clip`` when set); one fused pass.

        Without clipping, the fused per-tensor norms are combined directly:
        ``get_total_norm`` first regroups tensors by device and dtype in Python,
        which costs more than the norms on a small model.
        """
        if clip is not None:
            return float(torch.nn.utils.clip_grad_norm_(self.trainable, clip))
        grads = [p.grad for p in self.trainable if p.grad is not None]
        if not grads:
            return 0.0
        if self.single_group:
            return float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))))
        return float(torch.nn.utils.get_total_norm(grads))

    # -- validation ------------------------------------------------------------------

    @torch.no_grad()
    def _validate(self) -> Stop | None:
        self.phase = "validation"
        measure = self._measured() or not self._validated
        size = self.config["loop"]["microbatch"] * self.config["loop"]["accumulation"]
        with self.probe.phase(
            "validation", {"examples": len(self.val_set), "batch": size}, measure=measure
        ):
            total, units, records = evaluate(
                self.task, self.model, self.val_set, size, self.device, self._autocast
            )
        self._validated = True
        scores = {f"val/{k}": float(v) for k, v in self.task.score(records).items()}
        scores["val/loss"] = total / max(1, units)
        self.metrics.log_dict(self.step, scores, self.examples_seen)
        self.metrics.flush()  # a validation point is a natural sync point: bound what a crash loses
        if self.writes:
            self._save_predictions(records)
        self._write_phases()
        stop = self.rules.after_validation(scores.get(self.config["validation"]["metric"]))
        return replace(stop, phase="validation") if stop is not None else None

    def _save_predictions(self, records: list[dict[str, Any]]) -> None:
        path = self.folder / "predictions" / f"step-{self.step:08d}{self._segment_suffix}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        frame = pd.DataFrame.from_records(
            [
                {"id": r["id"], "prediction": str(r["prediction"]), "target": str(r["target"])}
                for r in records
            ]
        )
        temporary = path.with_suffix(".partial")
        frame.to_parquet(temporary, index=False)
        os.replace(temporary, path)
        self.ledger.add_artifact(
            self.run_id,
            "predictions",
            str(path),
            ckpt.file_sha256(path),
            path.stat().st_size,
            self.step,
            lease=self.lease,
        )

    # -- checkpoints --------------------------------------------------------------------

    @property
    def _segment_suffix(self) -> str:
        """Files of later segments carry their ordinal: a resumed run never overwrites (and a
        stale worker never clobbers) another segment's file."""
        return "" if self.segment_ordinal == 1 else f"-segment-{self.segment_ordinal}"

    def save_checkpoint(self) -> int | None:
        self.phase = "checkpoint"
        if not self.writes:
            return None
        if self._lease_lost.is_set():
            raise LeaseLost(f"run {self.run_id}: lease gone; no checkpoint written")
        self.metrics.flush()
        with self.probe.phase("checkpoint", {"step": self.step}, measure=self._measured()):
            tensors, state = capture_state(
                self.model,
                self.optimizer,
                self.scheduler,
                self.scaler,
                self.order,
                run_id=self.run_id,
                step=self.step,
                examples_seen=self.examples_seen,
                stop_rules=self.rules.state(),
                metric_buffer=self.metrics.pending_rows(),
                config_sha256=self.record.config_sha256,
            )
            name = f"step-{self.step:08d}{self._segment_suffix}.safetensors"
            saved = ckpt.save(
                self.folder / "checkpoints" / name,
                tensors,
                state,
            )
        artifact = self.ledger.add_artifact(
            self.run_id,
            "checkpoint",
            str(saved.path),
            saved.sha256,
            saved.size,
            saved.step,
            lease=self.lease,
        )
        self._write_phases()
        return artifact

    def _latest_checkpoint(self) -> dict[str, Any] | None:
        frame = self.ledger.artifacts(self.record.campaign)
        mine = frame[(frame["run_id"] == self.run_id) & (frame["kind"] == "checkpoint")]
        if mine.empty:
            return None
        row = mine.sort_values(["step", "id"]).iloc[-1]
        return {
            "id": int(row["id"]),
            "path": row["path"],
            "sha256": row["sha256"],
            "step": int(row["step"]),
        }

    def _restore(self, source: Mapping[str, Any]) -> None:
        self.phase = "resume"
        tensors, state = ckpt.load(Path(source["path"]), source["sha256"])
        if state.get("config_sha256") != self.record.config_sha256:
            raise ckpt.CheckpointError(f"checkpoint {source['path']} belongs to another config")
        restore_state(
            self.model, self.optimizer, self.scheduler, self.scaler, self.order, tensors, state
        )
        self.rules.restore(state["stop_rules"])
        self.step, self.examples_seen = int(state["step"]), int(state["examples_seen"])
        self.replayed_from = self.step
        self._pending = state.get("metric_buffer", [])

    # -- ending ------------------------------------------------------------------------

    def _end(self, stop: Stop, traceback_artifact: int | None) -> Outcome:
        """Checkpoint/export as the stop asks, then record the end. The heartbeat keeps going
        until the end is recorded: exporting and the replay check may take a while."""
        if not self.writes:
            self.probe.drain()
            return Outcome(self.run_id, stop.status, stop.cause, self.step, stop.detail)
        phase = stop.phase or self.phase
        try:
            if stop.status in ("interrupted", "completed", "stopped"):
                self.save_checkpoint()
            if stop.status in ("completed", "stopped"):
                self._export()
        except LeaseLost:
            raise
        except Exception as error:  # a failure while ending still ends the run, as failed
            stop = Stop(
                "failed",
                "exception",
                f"while ending ({stop.cause}): {type(error).__name__}: {_first_line(error)}",
            )
        with contextlib.suppress(Exception):
            self.metrics.close()
        self._compare_replayed_steps()
        detail = stop.detail + (
            f" (traceback: artifact {traceback_artifact})" if traceback_artifact else ""
        )
        step = self.step if stop.step is None else stop.step
        self.ledger.finish(
            self.run_id, stop.status, StopInfo(stop.cause, step, phase, detail), lease=self.lease
        )
        self._stop_heartbeat.set()
        return Outcome(self.run_id, stop.status, stop.cause, self.step, detail)

    def _export(self) -> None:
        self.phase = "export"
        path = self.folder / "final.safetensors"
        with self.probe.phase("export", {"step": self.step}):
            from campaign.loop.replay import write_final

            write_final(
                path,
                self.model,
                self.task,
                self.record.config,
                canonical_json(environment(self._task_reference())),
                self.device,
            )
        artifact = self.ledger.add_artifact(
            self.run_id,
            "final",
            str(path),
            ckpt.file_sha256(path),
            path.stat().st_size,
            self.step,
            lease=self.lease,
        )
        self._write_phases()
        if self.replay_in_subprocess:
            from campaign.loop.replay import replay_in_subprocess

            if not replay_in_subprocess(self.ledger, self.run_id, artifact):
                self.ledger.add_event(
                    self.record.campaign,
                    "replay",
                    "replay of the final artifact in a fresh process failed",
                    run_id=self.run_id,
                    lease=self.lease,
                )

    def _compare_replayed_steps(self) -> None:
        """Compare the steps a resumed segment re-executed with the values first logged."""
        if self.replayed_from is None:
            return
        frame = self.ledger.metrics(runs=[self.run_id], keys=["train/loss"], all_segments=True)
        mine = frame[frame["segment_id"] == self.segment_id].set_index("step")["value"]
        earlier = frame[frame["segment_id"] != self.segment_id]
        earlier = earlier[earlier["step"].isin(mine.index)].groupby("step")["value"].last()
        if earlier.empty:
            return
        difference = float((mine.loc[earlier.index] - earlier).abs().max())
        self.ledger.add_event(
            self.record.campaign,
            "determinism_check",
            f"{len(earlier)} replayed steps "
            f"({int(earlier.index.min())}-{int(earlier.index.max())}): "
            f"max |train/loss difference| = {difference:.3g}"
            + (" (identical)" if difference == 0 else ""),
            run_id=self.run_id,
            lease=self.lease,
        )

    def _save_traceback(self) -> int | None:
        if not self.writes:
            return None
        try:
            path = self.folder / "traceback.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(traceback.format_exc())
            return self.ledger.add_artifact(
                self.run_id,
                "traceback",
                str(path),
                ckpt.file_sha256(path),
                path.stat().st_size,
                self.step,
                lease=self.lease,
            )
        except Exception:  # the traceback is a courtesy; the run still ends as failed
            return None

    def _write_phases(self) -> None:
        records = self.probe.drain()
        if records and self.writes:
            self.ledger.add_phase_measurements(
                [{**r.row(run_id=self.run_id), "inputs": r.inputs} for r in records],
                lease=self.lease,
            )

    # -- signals and heartbeat ----------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, _frame: Any) -> None:
            self._signal = signum

        for signum in (signal.SIGTERM, signal.SIGINT, *self.preempt_signals):
            self._previous_handlers[signum] = signal.signal(signum, handler)

    def request_stop(self, signum: int) -> None:
        """Stop after the current update as if ``signum`` had arrived (checkpoint, interrupted)."""
        self._signal = signum

    def _start_heartbeat(self) -> None:
        """Stamp the run every ``heartbeat_s`` from a thread (a long update cannot starve it).

        A refused heartbeat means the lease is gone: the loop is told to stop.
        A database that cannot be reached is retried at the next beat; if it
        stays away past the limit, the run is declared lost by others.
        """

        def beat() -> None:
            while not self._stop_heartbeat.wait(self.heartbeat_s):
                try:
                    held = self.ledger.heartbeat(self.run_id, lease=self.lease)
                except Exception:
                    continue
                if not held:
                    self._lease_lost.set()
                    return

        name = f"heartbeat-{self.run_id}"
        self._heartbeat = threading.Thread(target=beat, name=name, daemon=True)
        self._heartbeat.start()

    def cleanup(self) -> None:
        self._stop_heartbeat.set()
        if self._heartbeat is not None and self._heartbeat is not threading.current_thread():
            # A daemon thread inside a database call while the interpreter exits can abort it.
            self._heartbeat.join(timeout=30)
        for signum, previous in self._previous_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous_handlers.clear()


class DiscardedMetrics:
    """The metric writer of a non-zero replica: rank 0 logs the run's (global) values."""

    def log(self, *args: Any, **kwargs: Any) -> None:
        return None

    log_dict = log

    def flush(self) -> int:
        return 0

    def close(self) -> None:
        return None

    def pending_rows(self) -> list[list[Any]]:
        return []


def describe_inputs(batches: Sequence[Batch], microbatch: int) -> dict[str, Any]:
    """Shapes, longest length and microbatch of what an update works on (for measurements)."""
    shapes = {k: list(v.shape) for k, v in batches[0].items() if isinstance(v, torch.Tensor)}
    longest = max((int(b["lengths"].max()) for b in batches if "lengths" in b), default=None)
    return {
        "microbatch": microbatch,
        "microbatches": len(batches),
        "shapes": shapes,
        "longest": longest,
    }


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def execute(ledger: Ledger, run_id: str, *, artifacts: Path, **options: Any) -> Outcome:
    """Run (or resume) one run in this process: the four calls of a recipe."""
    loop = RunLoop(ledger, run_id, artifacts=artifacts, **options)
    try:
        loop.setup()
        return loop.train()
    finally:
        loop.cleanup()


__all__ = ["LoopError", "Outcome", "RunLoop", "accumulate", "build_parts", "evaluate", "execute"]
