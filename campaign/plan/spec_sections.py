"""The spec file's sections as pydantic models (docs/spec.md, contract): strict types,
unknown keys refused, and the few rules that tie two keys of one section together."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)

from campaign.plan.metric_names import metric_mode
from campaign.plan.search_spec import SearchSection

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
TASK_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
DURATION_PATTERN = r"^\d+(\.\d+)?(s|m|h|d)$"
MAX_SPEC_BYTES = 1 << 20
MAX_VARIANTS = 10_000
CAMPAIGN_WIDE = ("validation", "stop")

Scalar = StrictBool | StrictInt | StrictFloat | StrictStr
Value = Scalar | list[Scalar]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class CampaignSection(_Section):
    name: str = Field(pattern=NAME_PATTERN)
    question: str = Field(pattern=r"\S")  # a question of only spaces asks nothing
    task: str = Field(pattern=TASK_PATTERN)


class ValidationSection(_Section):
    every: int = Field(ge=1)
    metric: str = Field(pattern=r"^val/\S+$")
    mode: Literal["max", "min"]
    # Examples per validation batch (no gradients: often larger than a training
    # microbatch); default microbatch x accumulation.
    microbatch: int | None = Field(None, ge=1)
    # Validate on a seeded, fixed sample of this many validation examples (the same every
    # time), and estimate the training loss on a fixed sample of training examples too
    # (logged as train_eval/loss and train_eval/<score>, as nanoGPT estimates both).
    sample: int | None = Field(None, ge=1)
    train_sample: int | None = Field(None, ge=1)
    # Validate after updates offset, offset + every, ... (0: every, 2 x every, ...): a script
    # that counts its steps from 0 and evaluates after the step validates at 1, 1 + every.
    offset: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _offset_within_every(self) -> ValidationSection:
        if self.offset >= self.every:
            raise ValueError(f"validation.offset must be below validation.every "
                             f"({self.every}), got {self.offset}")
        return self

    def resolved(self) -> dict[str, object]:
        """The run config's ``validation``: ``offset`` only where it is set, so a campaign
        planned before the key existed keeps its frozen configs."""
        dumped = self.model_dump()
        if not self.offset:
            dumped.pop("offset")
        return dumped


class StopSection(_Section):
    loss_explosion: float | None = Field(None, gt=1)
    patience: int = Field(0, ge=0)
    wall_time: str | None = Field(None, pattern=DURATION_PATTERN)
    # No progress (no phase, microbatch or validation batch) for this long: failed/stalled.
    stall: str | None = Field(None, pattern=DURATION_PATTERN)


class VariantSection(_Section):
    name: str = Field(pattern=NAME_PATTERN)
    set: dict[str, Value] = {}


class GridSection(_Section):
    seeds: list[int] = Field(min_length=1)
    control: str
    variants: list[VariantSection] = []
    axes: dict[str, list[Scalar]] = {}


class PilotSection(_Section):
    """How the pilot's overfit gate proves the task learnable (shown with its verdict)."""

    overfit_examples: int = Field(8, ge=2)
    overfit_steps: int = Field(60, ge=1)
    overfit_lr: float = Field(1e-2, gt=0)
    overfit_factor: float = Field(5.0, ge=1)
    # A key of the task's score() and the value it must reach on the overfit examples
    # (token accuracy for a language model); without it every prediction must be exact.
    overfit_metric: str | None = None
    overfit_threshold: float | None = None
    # min: an error falls to the threshold; max: a score rises to it (default: by the name)
    overfit_mode: Literal["min", "max"] | None = None

    @model_validator(mode="after")
    def _threshold_fits_metric(self) -> PilotSection:
        if self.overfit_metric is None:
            if self.overfit_mode is not None:
                raise ValueError("overfit_mode needs overfit_metric (the score it directs)")
            return self
        mode = self.overfit_mode or metric_mode(self.overfit_metric)
        if mode == "min" and self.overfit_threshold is None:
            raise ValueError(f"overfit_metric {self.overfit_metric!r} is minimised (lower is "
                             "better): set overfit_threshold, the value it must fall to")
        return self


class SpecDocument(_Section):
    campaign: CampaignSection
    hold: dict[str, Value] = {}
    config: dict[str, Value] = {}
    validation: ValidationSection
    stop: StopSection = StopSection()
    pilot: PilotSection = PilotSection()
    grid: GridSection
    search: SearchSection | None = None


