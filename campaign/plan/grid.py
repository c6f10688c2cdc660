"""Planning: grid -> variants x seeds -> planned runs, and the arithmetic of docs/spec.md
("What the planner records").

examples per update = microbatch x accumulation x data replicas (model
parallelism does not multiply it). The spec fixes either the number of
updates or the number of epochs; the planner computes the other, the
examples seen, the epochs as a fraction, and records them in every run's
config together with the last-batch policy. Planning starts nothing.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from campaign.errors import RefusedWrite
from campaign.ledger import CampaignRecord, Ledger, LedgerInputError, NewRun, NewVariant, NotFound
from campaign.ledger.canonical import canonical_json, sha256_text
from campaign.plan.config_keys import held_deviations
from campaign.plan.search_spec import check_rungs, search_plan
from campaign.plan.spec import ResolvedSpec, SpecError, resolve_config
from campaign.plan.task_facts import train_size

ACCOUNTING_KEYS = ("examples_per_update", "examples_seen", "updates_per_epoch", "fixed",
                   "draws_per_example")
MAX_UPDATES = 10**9  # as budget.updates allows (config_schema)


@dataclass(frozen=True)
class Accounting:
    """How much data one run sees, in updates, examples and epochs."""

    microbatch: int
    accumulation: int
    replicas: int
    examples_per_update: int
    updates: int
    examples_seen: int
    epochs: float | None  # None when the training set size is unknown, or with replacement
    train_examples: int | None
    updates_per_epoch: int | None
    last_batch: str
    draws_per_example: float | None = None  # with replacement: examples drawn / the split's


def account(
    microbatch: int,
    accumulation: int,
    replicas: int = 1,
    *,
    updates: int | None = None,
    epochs: float | None = None,
    train_examples: int | None = None,
    last_batch: str = "partial",
    sampling: str = "epochs",
) -> Accounting:
    """The arithmetic of §6. With ``epochs``, the training set size is required.

    ``last_batch``: ``partial`` keeps the incomplete last update of an epoch
    (normalised exactly, docs/tasks.md); ``drop`` skips it.
    """
    per_update = microbatch * accumulation * replicas
    if sampling != "epochs":  # drawn per update (by the task: at most per_update): no epochs
        if updates is None:
            raise ValueError(f"{sampling} sampling has no epochs: set budget.updates")
        seen = updates * per_update
        return Accounting(microbatch, accumulation, replicas, per_update, updates, seen, None,
                          train_examples, None, last_batch,
                          None if train_examples is None else seen / train_examples)
    per_epoch = None
    if train_examples is not None:
        rounding = math.ceil if last_batch == "partial" else math.floor
        per_epoch = max(1, rounding(train_examples / per_update))
    if (updates is None) == (epochs is None):
        raise ValueError("give exactly one of updates or epochs")
    if epochs is not None:
        if train_examples is None or per_epoch is None:
            raise ValueError("an epoch budget needs the number of training examples")
        if float(epochs).is_integer():
            updates = int(epochs) * per_epoch
            seen = int(epochs) * (train_examples if last_batch == "partial"
                                  else per_epoch * per_update)
        else:
            updates = max(1, math.floor(epochs * train_examples / per_update))
            seen = updates * per_update
        if updates > MAX_UPDATES:
            raise ValueError(f"budget.epochs = {epochs:g} is {updates:,} updates; at most "
                             f"{MAX_UPDATES:,} are planned")
    else:
        assert updates is not None
        seen = updates * per_update
        if per_epoch is not None and last_batch == "partial" and train_examples is not None:
            whole, rest = divmod(updates, per_epoch)
            seen = whole * train_examples + min(rest * per_update, train_examples)
    epochs_done = None if train_examples is None else seen / train_examples
    return Accounting(
        microbatch, accumulation, replicas, per_update, updates, seen,
        epochs_done, train_examples, per_epoch, last_batch,
    )


def account_config(config: Mapping[str, Any], train_examples: int | None = None) -> Accounting:
    loop, budget = config["loop"], config["budget"]
    return account(
        loop["microbatch"], loop["accumulation"], loop["replicas"],
        updates=budget.get("updates") if budget.get("epochs") is None else None,
        epochs=budget.get("epochs"),
        train_examples=budget.get("train_examples") or train_examples,
        last_batch=loop["last_batch"], sampling=loop.get("sampling", "epochs"),
    )


def with_accounting(config: Mapping[str, Any], accounting: Accounting) -> dict[str, Any]:
    """The config with both budget quantities and the examples recorded."""
    result = copy.deepcopy(dict(config))
    fixed = "epochs" if result["budget"].get("epochs") is not None else "updates"
    result["budget"] = {
        **result["budget"],
        "fixed": fixed,
        "updates": accounting.updates,
        "epochs": accounting.epochs,
        "train_examples": accounting.train_examples,
        "examples_per_update": accounting.examples_per_update,
        "examples_seen": accounting.examples_seen,
        "updates_per_epoch": accounting.updates_per_epoch,
    }
    if accounting.draws_per_example is not None:  # what a run drawing with replacement does
        result["budget"]["draws_per_example"] = accounting.draws_per_example
    return result


@dataclass(frozen=True)
class PlannedRun:
    variant: str
    seed: int
    config: dict[str, Any]

    @property
    def config_sha256(self) -> str:
        return sha256_text(canonical_json(self.config))


@dataclass(frozen=True)
class Plan:
    spec: ResolvedSpec
    accounting: dict[str, Accounting]  # per variant
    runs: tuple[PlannedRun, ...]

    @property
    def warnings(self) -> list[str]:
        seen = {name: a.examples_seen for name, a in self.accounting.items()}
        if len(set(seen.values())) > 1:
            listed = ", ".join(f"{n}: {s:,}" for n, s in seen.items())
            return [f"variants see different numbers of examples ({listed})"]
        return []


def make_plan(spec: ResolvedSpec, *, where: str | None = None,
              sizes: Mapping[str, int | str] | None = None) -> Plan:
    """Resolve the accounting of every variant and one run per (variant, seed). ``sizes``:
    the training-set size per task config (:func:`task_facts`), when already asked."""
    accounting: dict[str, Accounting] = {}
    runs = []
    counted: dict[str, int | None] = {}  # training-set size per distinct task config
    for variant in spec.variants:
        try:
            stated = variant.config["budget"].get("train_examples")
            key = canonical_json(variant.config["task"])
            needed = stated is None and variant.config["budget"].get("epochs") is not None
            if key not in counted:
                counted[key] = (_size_from(sizes[key], needed) if sizes is not None and key in sizes
                                else count_train_examples(spec.task, variant.config, needed))
            train = counted[key]
            if stated is not None and train is not None and int(stated) != train:
                raise ValueError(
                    f"budget.train_examples = {stated}, but the task's train split has {train} "
                    "examples: remove budget.train_examples (the task says it) or fix it"
                )
            accounting[variant.name] = account_config(variant.config, train)
        except ValueError as error:
            raise SpecError(f"{where or spec.path}: variant {variant.name!r}: {error}") from None
        config = with_accounting(variant.config, accounting[variant.name])
        for seed in spec.seeds:
            runs.append(PlannedRun(variant.name, seed, {**config, "seed": seed}))
    search = search_plan(spec.document)
    control = spec.control
    check_rungs(search, accounting[control.name].updates, control.config["validation"],
                where or spec.path)
    return Plan(spec, accounting, tuple(runs))


def count_train_examples(task: str, config: Mapping[str, Any], needed: bool) -> int | None:
    """Ask the task how many training examples it has, to record epochs as a fraction.

    ``needed``: an epoch budget cannot be planned without it (an error); for an
    update budget a task that cannot tell leaves the epochs unknown.
    """
    from campaign.errors import TaskContractError
    from campaign.host import calls

    try:
        counted = calls.call(train_size, task, dict(config), task=task,
                             what="counting the task's training examples")
    except TaskContractError as error:  # it hung, exited or killed its process: say so
        raise ValueError(str(error)) from None
    return _size_from(counted, needed)


def _size_from(counted: int | str, needed: bool) -> int | None:
    """The size the task gave, or None (its reason raised when an epoch budget needs it)."""
    if isinstance(counted, int):
        return counted
    if needed:
        raise ValueError(
            f"an epoch budget needs the training-set size: set budget.train_examples "
            f"or give the task a splits() ({counted})"
        )
    return None


def record_plan(ledger: Ledger, plan: Plan) -> tuple[CampaignRecord, bool]:
    """Write the campaign, its variants and its planned runs in one transaction.

    Returns (campaign, created). The same name with the identical spec is a
    no-op (created False); with a different spec it is refused: a new
    question gets a new name.
    """
    existing = _existing(ledger, plan.spec.name)
    if existing is not None:
        return _same_plan(existing, plan, ledger), False
    try:
        record = ledger.create_campaign(
            plan.spec.name,
            question=plan.spec.question,
            task=plan.spec.task,
            spec=canonical_json(plan.spec.document),
            variants=[NewVariant(v.name, v.is_control, v.overrides) for v in plan.spec.variants],
            runs=[NewRun(r.variant, r.seed, r.config) for r in plan.runs],
        )
    except RefusedWrite:  # another plan of the same name committed between the read and here
        existing = _existing(ledger, plan.spec.name)
        if existing is None:
            raise
        return _same_plan(existing, plan, ledger), False  # identical plans at once: one is kept
    return record, True


def _same_plan(existing: CampaignRecord, plan: Plan, ledger: Ledger) -> CampaignRecord:
    """``existing`` when it is this very plan, or the same question with other ``[pilot]``
    settings (how the pilot checks is not the question: the new table is recorded as a
    ``pilot_settings`` event, which the next pilot uses); refused otherwise (a new question
    gets a new name)."""
    table = dict(plan.spec.document.get("pilot") or {})
    if existing.spec_sha256 == plan.spec.sha256:  # the plan itself; its [pilot] back in force
        if table != current_pilot_table(ledger, existing.name):
            ledger.add_event(existing.name, "pilot_settings", canonical_json(table))
        return existing
    refuse_another_question(existing, plan)  # the same question: only [pilot] differs
    if table != current_pilot_table(ledger, existing.name):
        ledger.add_event(existing.name, "pilot_settings", canonical_json(table))
    return existing


def refuse_another_question(existing: CampaignRecord, plan: Plan) -> None:
    """Refused (naming the first key that changed) when ``plan`` asks another question than
    the campaign of its name already planned: its spec differs beyond ``[pilot]``. What
    ``plan --dry-run`` checks too, writing nothing."""
    mine = {k: v for k, v in plan.spec.document.items() if k != "pilot"}
    stored = {k: v for k, v in existing.spec_document.items() if k != "pilot"}
    if canonical_json(mine) == canonical_json(stored):
        return
    changed = first_difference(stored, mine)
    raise LedgerInputError(
        f"campaign {plan.spec.name!r} is already planned with a different spec "
        f"({changed} changed; sha256 {existing.spec_sha256[:12]} vs {plan.spec.sha256[:12]}): "
        "a new question gets a new name"
    )


def first_difference(old: Any, new: Any, path: str = "") -> str:
    """The first key path where two spec documents differ (``search.space."optimizer.lr"``):
    what a refused re-plan names, a search's changed space included."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            if canonical_json(old.get(key)) != canonical_json(new.get(key)):
                name = f'"{key}"' if "." in key else key
                return first_difference(old.get(key), new.get(key),
                                        f"{path}.{name}" if path else name)
    return path or "the spec"


def _existing(ledger: Ledger, name: str) -> CampaignRecord | None:
    try:
        return ledger.campaign(name)
    except NotFound:
        return None


def relaunch_config(
    config: Mapping[str, Any], sets: Mapping[str, Any], hold: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """A relaunch's config: the old one with ``sets`` applied, validated and re-accounted.

    Returns the config and the held keys it changes (a deviation from the plan).
    """
    base = copy.deepcopy(dict(config))
    extra = {k: base.pop(k) for k in ("validation", "stop", "seed") if k in base}
    fixed = base["budget"].get("fixed", "updates")
    for key in ACCOUNTING_KEYS:
        base["budget"].pop(key, None)
    # Keep only the budget quantity the spec fixed; the planner recomputes the other.
    base["budget"].pop("epochs" if fixed == "updates" else "updates", None)
    dotted = _flatten(base)
    for key in sets:
        if key == MEMORY_ONLY:  # the validation batch: what an OOM in validation needs
            extra["validation"] = {**extra.get("validation", {}),
                                   "microbatch": _validation_batch(sets[key], config)}
        elif key.split(".")[0] in ("validation", "stop", "seed"):
            only = (f" (of the validation settings only {MEMORY_ONLY}, which sets memory, "
                    "not results)" if key.startswith("validation.") else "")
            raise LedgerInputError(
                f"--set {key}: campaign-wide settings cannot change in a relaunch{only}")
        if key in ("budget.updates", "budget.epochs"):
            dotted.pop("budget.updates", None)
            dotted.pop("budget.epochs", None)
    sets = {k: v for k, v in sets.items() if k != MEMORY_ONLY}
    dotted.update(sets)
    origins = {k: f"--set {k}" if k in sets else f"run config {k}" for k in dotted}
    resolved = resolve_config(dotted, origins, "relaunch")
    try:
        accounting = account_config(resolved)
    except ValueError as error:
        raise LedgerInputError(f"relaunch: {error}") from None
    resolved = with_accounting(resolved, accounting)
    resolved.update(extra)
    changed_held = held_deviations(resolved, hold)
    return resolved, changed_held


MEMORY_ONLY = "validation.microbatch"  # the one validation setting a relaunch may change


def _validation_batch(value: Any, config: Mapping[str, Any]) -> int:
    """The relaunch's validation batch: no larger than the run's own (its gate class's pilot
    measured that one, so a smaller batch stays within what was piloted)."""
    loop = config["loop"]
    had = (config.get("validation") or {}).get("microbatch") or (
        int(loop["microbatch"]) * int(loop["accumulation"]))
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= had:
        raise LedgerInputError(f"--set {MEMORY_ONLY}: expected a whole number from 1 to the "
                               f"run's validation batch, {had}, got {value!r} (a relaunch may "
                               "only shrink it: the pilot measured that one)")
    return value


def _flatten(nested: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config -> dotted keys (None values dropped: they are the defaults)."""
    flat: dict[str, Any] = {}
    for key, value in nested.items():
        if isinstance(value, Mapping):
            flat |= _flatten(value, f"{prefix}{key}.")
        elif value is not None:
            flat[f"{prefix}{key}"] = value
    return flat


def accounting_rows(plan: Plan) -> list[dict[str, Any]]:
    rows = []
    for name, a in plan.accounting.items():
        row = asdict(a)
        if row["epochs"] is not None:  # for reading: 3.334, not 3.3340292275574113
            row["epochs"] = round(row["epochs"], 4)
        rows.append({"variant": name, **{k: row[k] for k in (
            "microbatch", "accumulation", "replicas", "examples_per_update", "updates",
            "examples_seen", "epochs", "last_batch")}})
    return rows


def current_pilot_table(ledger: Any, campaign: str) -> dict[str, Any]:
    """The ``[pilot]`` table in force: the latest ``pilot_settings`` event, else the spec's."""
    events = ledger.events(campaign)
    settings = events[(events["kind"] == "pilot_settings") & events["run_id"].isna()]
    if len(settings):
        return dict(json.loads(settings["detail"].iloc[-1]))
    return dict(ledger.campaign(campaign).spec_document.get("pilot") or {})
