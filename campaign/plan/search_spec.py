"""The spec's ``[search]`` section (docs/spec.md, "Searches", contract): its pydantic model,
the rules that tie its keys together, and the probe configs through which ``plan`` checks the
space like any key (types and ranges by the run config schema, ``task.*`` keys by the task's
declared schema, each refusal naming ``search.space."KEY"``).

What is checked where: the section's own keys here, when the spec is resolved; the rungs
against the budget and the validation steps in :func:`check_rungs`, once the planner knows
the updates (an epoch budget is counted from the task's training set).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from campaign.errors import SpecError
from campaign.loop.stop import validates_after

METHODS = ("grid", "random", "tpe", "halving")
MAX_TRIALS = 1000
MIN_CONFIRM_SEEDS = 3  # a paired interval needs 3 pairs (report/conclusions.py)

Number = StrictInt | StrictFloat
Choice = StrictInt | StrictFloat | StrictStr | bool


class _SearchTable(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Distribution(_SearchTable):
    """One key's distribution: exactly one of the four forms."""

    log_uniform: list[Number] | None = None
    uniform: list[Number] | None = None
    int: list[Number] | None = None  # whole numbers: checked with the range, in words
    choice: list[Choice] | None = None

    @property
    def kind(self) -> str:
        return next(k for k in ("log_uniform", "uniform", "int", "choice")
                    if getattr(self, k) is not None)

    @property
    def values(self) -> list[Any]:
        return list(getattr(self, self.kind))


class SearchSection(_SearchTable):
    method: Literal["grid", "random", "tpe", "halving"] = "grid"
    sampler: Literal["random", "tpe"] | None = None
    trials: int | None = Field(None, ge=1, le=MAX_TRIALS)
    # Proposals made together from the results of the cohorts before (docs/spec.md): a
    # restarted launcher proposes the same variants whatever the timing.
    cohort: int | None = Field(None, ge=1, le=MAX_TRIALS)
    seed: int = Field(0, ge=0, lt=2**32)
    rungs: list[int] = []
    keep: float | None = Field(None, gt=0, lt=1)
    rule: Literal["rank", "evidence"] = "rank"
    audit: float = Field(0.0, ge=0, lt=1)
    confirm: int = Field(1, ge=0)
    confirm_seeds: list[int] = []
    space: dict[str, Distribution] = {}


@dataclass(frozen=True)
class SearchPlan:
    """The search as the conductor (campaign/search/) reads it from the frozen spec."""

    method: str
    sampler: str | None
    trials: int
    cohort: int
    seed: int
    rungs: tuple[int, ...]
    keep: float
    rule: str
    audit: float
    confirm: int
    confirm_seeds: tuple[int, ...]
    space: dict[str, Distribution]
    search_seeds: tuple[int, ...]

    @property
    def halving(self) -> bool:
        return self.method == "halving"

    @property
    def proposes(self) -> bool:
        return bool(self.space)

    @property
    def cohorts(self) -> int:
        return math.ceil(self.trials / self.cohort) if self.proposes else 1


def search_plan(document: Mapping[str, Any]) -> SearchPlan | None:
    """The search of a (validated, frozen) spec document; None for a plain grid."""
    section = document.get("search")
    if not section:
        return None
    search = SearchSection.model_validate(section)
    if search.method == "grid":
        return None
    trials = search.trials or 0
    # at most every trial at once (one cohort: the same proposals, said as they are made)
    cohort = min(search.cohort or (trials if search.method != "tpe" else 4), trials) or 1
    return SearchPlan(
        method=search.method,
        sampler=(search.method if search.method in ("random", "tpe")
                 else (search.sampler or "random")) if search.space else None,
        trials=trials, cohort=cohort, seed=search.seed, rungs=tuple(search.rungs),
        keep=search.keep or 1.0, rule=search.rule, audit=search.audit, confirm=search.confirm,
        confirm_seeds=tuple(search.confirm_seeds), space=dict(search.space),
        search_seeds=tuple(document["grid"]["seeds"]))


def check_search(search: SearchSection | None, seeds: Sequence[int], hold: Mapping[str, Any],
                 variants: Sequence[tuple[str, str, dict[str, Any]]], where: str,
                 patience: int = 0) -> None:
    """The rules between the keys of ``[search]`` (one refusal naming the key)."""
    if search is None:
        return
    def refuse(path: str, message: str) -> SpecError:
        return SpecError(f"{where}: search.{path}: {message}")

    method = search.method
    if method == "grid":
        for name in ("sampler", "trials", "rungs", "keep", "space", "confirm_seeds"):
            if name in search.model_fields_set:
                raise refuse(name, 'only for a search (method "random", "tpe" or "halving"); '
                             'method "grid" runs the grid as planned')
        return
    if method in ("random", "tpe"):
        if not search.space:
            raise refuse("space", f'method "{method}" samples [search.space]: give at least one '
                         "key's distribution")
        for name in ("sampler", "rungs", "keep"):
            if name in search.model_fields_set:
                raise refuse(name, f'only with method "halving" (method "{method}" runs '
                             "every trial to the full budget)")
    if method == "halving":
        if not search.rungs:
            raise refuse("rungs", "halving needs the updates at which variants are compared, "
                         "e.g. rungs = [50, 150]")
        if search.keep is None:
            raise refuse("keep", "halving needs the share kept at each rung, in (0, 1)")
        if patience:
            raise refuse("method", "halving decides at rungs what stop.patience would decide "
                         "on its own: a seed stopped early has no value at the rung and "
                         "prunes its variant; set stop.patience = 0")
        if not search.space and "sampler" in search.model_fields_set:
            raise refuse("sampler", "a sampler proposes from [search.space], which is empty")
        if not search.space and len(variants) < 3:
            raise refuse("method", "halving over the grid needs at least 2 variants beside the "
                         "control (or a [search.space] to sample)")
    if search.space and search.trials is None:
        raise refuse("trials", "how many variants the sampler may propose (e.g. trials = 24)")
    if not search.space:
        for name in ("trials", "cohort"):
            if name in search.model_fields_set:
                raise refuse(name, "only with a [search.space] to sample")
    candidates = (search.trials or 0) + len(variants) - 1  # the control is not a candidate
    if search.confirm > candidates:
        raise refuse("confirm", f"{search.confirm} variants to confirm, of {candidates} the "
                     "search can have (search.trials and the grid's variants beside the "
                     "control)")
    for i, rung in enumerate(search.rungs):
        if rung < 1 or (i and rung <= search.rungs[i - 1]):
            raise refuse(f"rungs[{i}]", f"expected increasing updates from 1, got {rung}")
    if search.rule == "evidence" and len(seeds) < MIN_CONFIRM_SEEDS:
        raise refuse("rule", f'"evidence" prunes on a paired interval, which needs at least '
                     f"{MIN_CONFIRM_SEEDS} seeds in grid.seeds (it has {len(seeds)})")
    if search.confirm:
        confirm = search.confirm_seeds
        if len(confirm) < MIN_CONFIRM_SEEDS:
            raise refuse("confirm_seeds", f"expected at least {MIN_CONFIRM_SEEDS} fresh seeds "
                         "(the conclusion's paired interval needs 3), or confirm = 0")
        for i, seed in enumerate(confirm):
            if seed < 0 or seed >= 2**32:
                raise refuse(f"confirm_seeds[{i}]", f"expected a seed in [0, 2**32), got {seed}")
            if seed in seeds:
                raise refuse(f"confirm_seeds[{i}]", f"seed {seed} is also a search seed "
                             "(grid.seeds): confirmation needs seeds the search never used")
            if confirm.count(seed) > 1:
                raise refuse("confirm_seeds", f"seed {seed} appears twice")
    elif search.confirm_seeds:
        raise refuse("confirm_seeds", "confirm = 0 re-runs nothing")
    for key, distribution in search.space.items():
        _check_distribution(key, distribution, hold, where)


def _check_distribution(key: str, distribution: Distribution, hold: Mapping[str, Any],
                        where: str) -> None:
    path = f'search.space."{key}"' if "." in key else f"search.space.{key}"
    set_forms = [k for k in ("log_uniform", "uniform", "int", "choice")
                 if getattr(distribution, k) is not None]
    if len(set_forms) != 1:
        raise SpecError(f"{where}: {path}: expected exactly one of log_uniform, uniform, int or "
                        f"choice, got {', '.join(set_forms) or 'none'}")
    if key in hold:
        raise SpecError(f"{where}: {path}: {key} is held identical across variants ([hold]); "
                        "a search varies only free keys")
    if key.split(".")[0] in ("validation", "stop", "seed", "budget"):
        raise SpecError(f"{where}: {path}: {key.split('.')[0]} settings are campaign-wide, "
                        "not searched")
    values = distribution.values
    kind = distribution.kind
    if kind == "choice":
        if not values:
            raise SpecError(f"{where}: {path}: choice: expected at least one value")
        if len({repr(v) for v in values}) != len(values):
            raise SpecError(f"{where}: {path}: choice: a value appears twice")
        return
    if len(values) != 2:
        raise SpecError(f"{where}: {path}: {kind}: expected [low, high], got {values!r}")
    if kind == "int" and not all(isinstance(v, int) for v in values):
        raise SpecError(f"{where}: {path}: int: expected whole numbers [low, high], got "
                        f"{values!r} (uniform or log_uniform draw fractions)")
    low, high = values
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        raise SpecError(f"{where}: {path}: {kind}: empty or inverted range [{low}, {high}] "
                        "(expected low < high)")
    if kind == "log_uniform" and low <= 0:
        raise SpecError(f"{where}: {path}: log_uniform: expected a positive low end, got {low}")


def probe_configs(space: Mapping[str, Distribution]) -> list[tuple[str, dict[str, Any]]]:
    """(origin, overrides): each key at each end of its range (each choice), one key at a
    time on the control; ``plan`` resolves and asks the task about each, so a value the
    sampler may draw is refused before anything is planned. A continuous range is probed
    with floats, one of them between the ends: a whole-number key (a width) is refused
    there, since the sampler would draw 96.1 (``int`` is its distribution)."""
    probes = []
    for key, distribution in space.items():
        path = f'search.space."{key}"' if "." in key else f"search.space.{key}"
        values = distribution.values
        if distribution.kind in ("uniform", "log_uniform"):
            low, high = float(values[0]), float(values[1])
            inside = (math.exp(math.log(low) + 0.371 * (math.log(high) - math.log(low)))
                      if distribution.kind == "log_uniform" else low + 0.371 * (high - low))
            values = [low, high, inside]
        for value in values:
            probes.append((path, {key: value}))
    return probes


def check_rungs(plan: SearchPlan | None, updates: int, validation: Mapping[str, Any],
                where: str) -> None:
    """Each rung a validation step before the budget (a rung compares validation values)."""
    if plan is None:
        return
    for i, rung in enumerate(plan.rungs):
        if rung >= updates:
            raise SpecError(f"{where}: search.rungs[{i}]: rung {rung} is not before the budget "
                            f"({updates} updates): a rung stops variants before the end")
        if not validates_after(rung, validation):
            every, offset = int(validation["every"]), int(validation.get("offset") or 0)
            first = offset or every
            raise SpecError(f"{where}: search.rungs[{i}]: rung {rung} is not a validation step "
                            f"(validation.every = {every}: {first}, {first + every}, ...)")
