"""The ``task.*`` keys each built-in task reads, as pydantic models (``TASK_KEYS``).

A typo in a task key once ran another experiment: ``lora_rnak = 16`` was ignored and rank
4 trained. A task declares its keys as ``TASK_KEYS`` (a pydantic model with
``extra = "forbid"``) on its factory or in its module, as ``REQUIREMENTS``; ``plan``
then refuses an unknown key or a wrong type at once, with "did you mean"
(:mod:`campaign.plan.task_keys`). Values that depend on each other (exactly one of
``model_path`` and ``model_config``) are still the task's to check when it is built.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Keys(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # "64" is not silently 64


class DigitsKeys(_Keys):
    hidden: int = Field(64, ge=1)
    val_fraction: float = Field(0.2, gt=0, lt=1)
    split_seed: int = Field(0, ge=0)
    limit: int | None = Field(None, ge=1)  # use only the first N examples (tests)


class ArithmeticKeys(_Keys):
    digits: int = Field(2, ge=1)
    train_size: int = Field(2000, ge=1)
    val_size: int = Field(200, ge=1)
    split_seed: int = Field(0, ge=0)
    width: int = Field(64, ge=1)
    layers: int = Field(2, ge=1)


class _HFModelKeys(_Keys):
    """What both Hugging Face tasks read: the model, LoRA, the data files, the tokenizer."""

    model_path: str | None = None
    model_config_: dict[str, Any] | None = Field(None, alias="model_config")
    adapter: Literal["none", "lora"] = "none"
    lora_rank: int | None = Field(None, ge=1)
    lora_alpha: float | None = Field(None, gt=0)
    lora_dropout: float | None = Field(None, ge=0, lt=1)
    lora_targets: list[str] | Literal["all-linear"] | None = None
    lora_modules_to_save: list[str] | None = None  # trained in full beside the adapter
    lora_use_rslora: bool | None = None  # scale alpha / sqrt(rank), not alpha / rank
    lora_init: bool | Literal["gaussian", "pissa", "olora"] | None = None
    lora_bias: Literal["none", "all", "lora_only"] | None = None
    data: dict[str, str] | None = None
    tokenizer_path: str | None = None
    vocab_size: int | None = Field(None, ge=16)
    base_seed: int | None = Field(None, ge=0)
    control_count: int | None = Field(None, ge=1)


class CausalLMKeys(_HFModelKeys):
    max_new_tokens: int | None = Field(None, ge=1)


class ClassifyKeys(_HFModelKeys):
    labels: list[str] | None = Field(None, min_length=2)  # class names in class-number order
