"""The resolved run config: its known keys, their types, ranges and defaults.

A campaign spec addresses this config with dotted keys (``optimizer.lr``).
Everything here is validated by pydantic (unknown keys refused, types
strict: a string is never silently turned into a number); task-specific keys
live under ``task`` and are the task's business.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "sgd")
SCHEDULERS = ("constant", "linear_warmup", "cosine", "linear", "step", "hf_linear", "hf_cosine")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class LoopConfig(_Strict):
    """Options that change memory and the effective batch (shown in the report)."""

    microbatch: int = Field(1, ge=1)
    accumulation: int = Field(1, ge=1)
    replicas: int = Field(1, ge=1)
    # How the ranks hold the model: each all of it ("replicate") or a shard (FSDP2, "fsdp");
    # shard_modules names the module list whose blocks are the units (docs/runs.md).
    strategy: Literal["replicate", "fsdp"] = "replicate"
    shard_modules: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    max_length: int | None = Field(None, ge=1)
    activation_checkpointing: bool = False
    # The module list whose blocks are checkpointed (a dotted path in the model).
    checkpoint_modules: str = Field("blocks", pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")
    clip_grad_norm: float | None = Field(None, gt=0)
    last_batch: Literal["partial", "drop"] = "partial"
    # The pilot's data gate fails when max_length cuts targets, unless allowed here.
    allow_target_truncation: bool = False
    checkpoint_every: int | None = Field(None, ge=1)
    # Batches prepared by torch DataLoader worker processes (0: in the training process),
    # ``prefetch`` updates ahead per worker; pinned memory for CUDA copies.
    loader_workers: int = Field(0, ge=0, le=256)
    prefetch: int = Field(2, ge=1, le=1024)
    pin_memory: bool = False
    # epochs: every example once per epoch, reshuffled; with_replacement: each update draws
    # its examples at random (seeded by the run's seed and the update: a resume stays exact);
    # task: the task's own training_order(seed, per_update), as the script it ports draws.
    sampling: Literal["epochs", "with_replacement", "task"] = "epochs"


class BudgetConfig(_Strict):
    """Exactly one of ``updates`` or ``epochs``; the planner records the other."""

    # Sane upper bounds: a billion updates, a million epochs (1e300 planned as 7e302 updates).
    updates: int | None = Field(None, ge=1, le=10**9)
    epochs: float | None = Field(None, gt=0, le=1e6)
    train_examples: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _one_budget(self) -> BudgetConfig:
        if (self.updates is None) == (self.epochs is None):
            raise ValueError("set exactly one of budget.updates or budget.epochs")
        return self


class OptimizerConfig(_Strict):
    """Any ``torch.optim`` optimizer by name; its arguments are checked against its signature
    when a spec is resolved (``campaign.plan.spec.resolve_config``, with the key's own path)."""

    name: str = "adamw"
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    decay: Literal["all", "matrices", "no_bias_norm"] = "all"
    momentum: float = Field(0.0, ge=0, lt=1)
    beta1: float = Field(0.9, gt=0, lt=1)
    beta2: float = Field(0.999, gt=0, lt=1)
    args: dict[str, Any] = {}


class SchedulerConfig(_Strict):
    """The learning-rate schedule; formulas in ``campaign.loop.optim`` and docs/spec.md."""

    name: Literal["constant", "linear_warmup", "cosine", "linear", "step", "hf_linear",
                  "hf_cosine"] = "constant"
    warmup: int = Field(0, ge=0)
    min_lr: float = Field(0.0, ge=0)
    decay_updates: int | None = Field(None, ge=1)
    step_every: int = Field(1, ge=1)
    gamma: float = Field(0.1, gt=0, le=1)


class CheckpointConfig(_Strict):
    """Retention: after a newer checkpoint is written and verified, only the newest
    ``keep_last`` files stay on disk (their ledger rows stay forever)."""

    keep_last: int = Field(3, ge=1)


class RunConfig(_Strict):
    """The resolved config of one run, before the planner's accounting is added."""

    loop: LoopConfig = LoopConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    budget: BudgetConfig
    optimizer: OptimizerConfig = OptimizerConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    task: dict[str, Any] = {}

    @model_validator(mode="after")
    def _epochs_need_epochs(self) -> RunConfig:
        if self.loop.sampling != "epochs" and self.budget.epochs is not None:
            how = ("draws each update's examples at random" if self.loop.sampling ==
                   "with_replacement" else "takes each update's examples from the task")
            raise ValueError(f"loop.sampling = {self.loop.sampling!r} {how}: a run has no "
                             "epochs to count; set budget.updates")
        return self


# Numbers written as integers in TOML are fine where a float is expected.
_FLOAT_FIELDS = {
    ("budget", "epochs"),
    ("loop", "clip_grad_norm"),
    *(("optimizer", f) for f in ("lr", "weight_decay", "momentum", "beta1", "beta2")),
    ("scheduler", "min_lr"),
    ("scheduler", "gamma"),
}


def widen_integers(nested: dict[str, Any]) -> dict[str, Any]:
    """Turn an int into a float where the schema wants a float (``lr = 1`` is fine)."""
    for section, field in _FLOAT_FIELDS:
        value = nested.get(section, {}).get(field)
        if isinstance(value, int) and not isinstance(value, bool):
            nested[section][field] = float(value)
    return nested
