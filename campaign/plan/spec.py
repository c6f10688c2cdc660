"""The campaign spec file (docs/spec.md): parse TOML, validate, resolve every variant, hash.

Every refusal is a :class:`SpecError` whose message is one line naming the
file, the key path as written in the file (``hold."loop.microbatch"``,
``grid.variants[2].set."optimizer.lr"``) and what was expected. Nothing is
written anywhere by this module.
"""

from __future__ import annotations

import difflib
import itertools
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)

from campaign.errors import SpecError
from campaign.ledger.canonical import canonical_json, sha256_text
from campaign.plan.config_schema import RunConfig, widen_integers
from campaign.plan.optimizer_check import raise_first
from campaign.plan.overrides import apply_sets, named
from campaign.plan.search_spec import check_search, probe_configs
from campaign.plan.spec_sections import (
    CAMPAIGN_WIDE,
    DURATION_PATTERN,
    MAX_SPEC_BYTES,
    MAX_VARIANTS,
    NAME_PATTERN,
    TASK_PATTERN,
    SpecDocument,
)


@dataclass(frozen=True)
class ResolvedVariant:
    name: str
    is_control: bool
    overrides: dict[str, Any]  # the dotted keys this variant sets
    config: dict[str, Any]  # the full nested config (without seed and accounting)


@dataclass(frozen=True)
class ResolvedSpec:
    path: str
    document: dict[str, Any]  # the spec as parsed, stored frozen with the campaign
    sha256: str
    name: str
    question: str
    task: str
    hold: dict[str, Any]
    seeds: tuple[int, ...]
    variants: tuple[ResolvedVariant, ...]
    # Key paths (as refusals name them) that a ``--set`` put there: the override to name.
    origins: dict[str, str] = field(default_factory=dict)
    sets: tuple[str, ...] = ()  # the ``--set KEY=VALUE`` items, as given
    # A search's space at its ends, resolved on the control (campaign/plan/search_spec.py):
    # (where the spec sets it, full config); plan asks the task about each.
    probes: tuple[tuple[str, dict[str, Any]], ...] = ()

    @property
    def control(self) -> ResolvedVariant:
        return next(v for v in self.variants if v.is_control)


def load_spec(path: str | Path, *, check_task: bool = True,
              optimizers: list[Any] | None = None, sets: Sequence[str] = ()) -> ResolvedSpec:
    """Read, validate and resolve the spec at ``path`` (a regular file of at most 1 MiB: a
    spec is a page of settings, and ``/dev/zero`` or a pipe must not be read for ever), with
    ``sets`` (``KEY=VALUE``, :mod:`campaign.plan.overrides`) applied before it is checked."""
    where = str(path)
    try:
        if Path(path).exists() and not Path(path).is_file():
            raise SpecError(f"{where}: not a regular file")
        with open(path, "rb") as handle:
            data = handle.read(MAX_SPEC_BYTES + 1)
        if len(data) > MAX_SPEC_BYTES:
            raise SpecError(f"{where}: larger than {MAX_SPEC_BYTES >> 20} MiB: not a spec")
        if Path(path).suffix == ".json":  # the frozen form a ledger and an archive hold
            document = _json_spec(data, where)
        else:
            document = tomllib.loads(data.decode("utf-8"))
        if not sets:
            return resolve_spec(document, where, check_task=check_task, optimizers=optimizers)
        try:
            document, origins = apply_sets(document, sets)
        except SpecError as error:
            raise SpecError(f"{where}: {error}") from None
        try:
            resolved = resolve_spec(document, where, check_task=check_task,
                                    optimizers=optimizers)
        except SpecError as error:
            raise SpecError(named(str(error), where, origins)) from None
        return replace(resolved, origins=origins, sets=tuple(sets))
    except FileNotFoundError:
        raise SpecError(f"{where}: no such spec file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise SpecError(f"{where}: cannot read the spec ({error})") from None
    except tomllib.TOMLDecodeError as error:
        raise SpecError(f"{where}: not valid TOML ({error})") from None
    except RecursionError:
        raise SpecError(f"{where}: nested too deeply (tables or arrays inside each other "
                        "hundreds of levels deep): not a spec") from None


def _json_spec(data: bytes, where: str) -> dict[str, Any]:
    import json

    try:
        document = json.loads(data.decode("utf-8"))
    except ValueError as error:
        raise SpecError(f"{where}: not valid JSON ({error})") from None
    if not isinstance(document, dict):
        raise SpecError(f"{where}: a spec is a JSON object, got {type(document).__name__}")
    return document


def resolve_spec(
    document: dict[str, Any], where: str = "<spec>", *, check_task: bool = True,
    optimizers: list[Any] | None = None,
) -> ResolvedSpec:
    """Validate a parsed spec document and resolve every variant into a full config.
    ``optimizers``: a list to which each variant's optimizer check is deferred (the caller
    runs them with :func:`campaign.plan.optimizer_check.raise_first`), else checked here."""
    bad = _non_finite(document)
    if bad is not None:  # the frozen spec is JSON, which has no inf or nan
        raise SpecError(f"{where}: {_path(bad[0])}: expected a finite number, got {bad[1]!r}")
    try:
        spec = SpecDocument.model_validate(document)
    except ValidationError as error:
        raise SpecError(f"{where}: {_describe(_first(error), SpecDocument)}") from None
    _check_grid(spec, where)
    if check_task:
        check_task_reference(spec.campaign.task, where)
    variants = _variants(spec, where)
    check_search(spec.search, spec.grid.seeds, spec.hold, variants, where,
                 spec.stop.patience)
    resolved = tuple(_resolve_variant(spec, v, where, optimizers) for v in variants)
    control = next(v for v in variants if v[0] == spec.grid.control)
    probes = tuple(
        (origin, _resolve_variant(spec, (control[0], "search.space", {**control[2], **sets}),
                                  where, optimizers).config)
        for origin, sets in probe_configs(spec.search.space if spec.search else {}))
    return ResolvedSpec(
        path=where,
        document=document,
        sha256=sha256_text(canonical_json(document)),
        name=spec.campaign.name,
        question=spec.campaign.question,
        task=spec.campaign.task,
        hold=dict(spec.hold),
        seeds=tuple(spec.grid.seeds),
        variants=resolved,
        probes=probes,
    )


# -- structure ------------------------------------------------------------------------


def _check_grid(spec: SpecDocument, where: str) -> None:
    seeds = spec.grid.seeds
    for i, seed in enumerate(seeds):
        if seed < 0 or seed >= 2**32:
            raise SpecError(f"{where}: grid.seeds[{i}]: expected a seed in [0, 2**32), got {seed}")
    if len(set(seeds)) != len(seeds):
        duplicate = next(s for s in seeds if seeds.count(s) > 1)
        raise SpecError(f"{where}: grid.seeds: seed {duplicate} appears twice")
    for key in set(spec.hold) & set(spec.config):
        raise SpecError(
            f"{where}: config.{_quote(key)}: also in [hold]; a key is either held or free"
        )
    for section, keys in (("hold", spec.hold), ("config", spec.config)):
        for key in keys:
            _check_dotted_key(key, f"{section}.{_quote(key)}", where)


def _check_dotted_key(key: str, path: str, where: str) -> None:
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", key):
        raise SpecError(f"{where}: {path}: expected a dotted key such as optimizer.lr")
    if key.split(".")[0] in CAMPAIGN_WIDE:
        section = key.split(".")[0]
        raise SpecError(
            f"{where}: {path}: {section} settings are campaign-wide: set them in [{section}]"
        )


def _variants(spec: SpecDocument, where: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, path of its settings, dotted overrides) for explicit variants and axes."""
    found = [
        (v.name, f"grid.variants[{i}].set", dict(v.set)) for i, v in enumerate(spec.grid.variants)
    ]
    axes = spec.grid.axes
    for key, values in axes.items():
        _check_dotted_key(key, f"grid.axes.{_quote(key)}", where)
        if not values:
            raise SpecError(f"{where}: grid.axes.{_quote(key)}: expected at least one value")
    if axes:
        keys = list(axes)
        count = math.prod(len(v) for v in axes.values()) + len(found)
        if count > MAX_VARIANTS:
            raise SpecError(f"{where}: grid.axes: the grid expands to {count:,} variants; "
                            f"at most {MAX_VARIANTS:,} are planned at once (split the question)")
        for combination in itertools.product(*(axes[k] for k in keys)):
            name = "_".join(f"{k.rsplit('.', 1)[-1]}-{_format(v)}" for k, v in
                            zip(keys, combination, strict=True))
            if not re.fullmatch(NAME_PATTERN, name):
                raise SpecError(
                    f"{where}: grid.axes: the variant name {name!r} made from the axis values "
                    f"is not a name: {PATTERN_WORDS[NAME_PATTERN]} (use [[grid.variants]])"
                )
            found.append((name, f"grid.axes ({name})", dict(zip(keys, combination, strict=True))))
    if not found:
        raise SpecError(
            f"{where}: grid: expected [[grid.variants]] or [grid.axes] (at least the control)"
        )
    names = [name for name, _, _ in found]
    for name in names:
        if names.count(name) > 1:
            origin = "grid.axes" if any(n == name for n, p, _ in found if p.startswith(
                "grid.axes")) else "grid.variants"
            raise SpecError(f"{where}: {origin}: variant name {name!r} appears twice")
    if spec.grid.control not in names:
        close = difflib.get_close_matches(spec.grid.control, names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        hint = f" ({hint}variants: {', '.join(names)})"
        raise SpecError(f"{where}: grid.control: {spec.grid.control!r} is not a variant{hint}")
    for name, path, overrides in found:
        for key in overrides:
            _check_dotted_key(key, f"{path}.{_quote(key)}", where)
            if key in spec.hold:
                raise SpecError(
                    f"{where}: {path}.{_quote(key)}: variant {name!r} changes {key}, "
                    "which is held identical across variants ([hold])"
                )
    return found


def check_task_reference(reference: str, where: str) -> None:
    """The task reference ``package.module:factory`` must import and name a callable. The import
    runs in a guarded child of the task host: a module that exits, hangs or prints at import
    is one error line, never the command's own exit."""
    from campaign.errors import TaskContractError
    from campaign.host import calls
    from campaign.plan.task_facts import task_reference_problem

    try:
        problem = calls.call(task_reference_problem, reference, what="importing the task",
                             task=reference)  # the task's preloads: once a host
    except TaskContractError as error:
        problem = str(error)
    if problem is not None:
        raise SpecError(f"{where}: campaign.task: {problem}")


# -- resolution -----------------------------------------------------------------------


def _resolve_variant(
    spec: SpecDocument, variant: tuple[str, str, dict[str, Any]], where: str,
    optimizers: list[Any] | None,
) -> ResolvedVariant:
    name, path, overrides = variant
    origins = {k: f"config.{_quote(k)}" for k in spec.config}
    origins |= {k: f"hold.{_quote(k)}" for k in spec.hold}
    origins |= {k: f"{path}.{_quote(k)}" for k in overrides}
    dotted = {**spec.config, **spec.hold, **overrides}
    config = resolve_config(dotted, origins, where, optimizers=optimizers)
    config["validation"] = spec.validation.resolved()
    config["stop"] = spec.stop.model_dump()
    return ResolvedVariant(name, name == spec.grid.control, overrides, config)


def resolve_config(
    dotted: Mapping[str, Any], origins: Mapping[str, str], where: str, *,
    optimizers: list[Any] | None = None,
) -> dict[str, Any]:
    """Nest dotted keys, validate against the run config schema, fill the defaults."""
    nested: dict[str, Any] = {}
    for key, value in dotted.items():
        if not _finite(value):  # JSON (the frozen config) has no inf or nan
            raise SpecError(f"{where}: {origins.get(key, key)}: expected a finite number, "
                            f"got {value!r}")
        _place(nested, key, value, origins, where)
    try:
        model = RunConfig.model_validate(widen_integers(nested))
    except ValidationError as error:
        first = _first(error)
        key = ".".join(str(p) for p in first["loc"])
        origin = origins.get(key) or next(
            (o for k, o in origins.items() if k.startswith(key + ".") or key.startswith(k)),
            None,
        ) if key else next(  # a rule between keys: where the first key it names was set
            (o for k, o in sorted(origins.items()) if k in str(first.get("msg", ""))), None)
        if origin is None:  # a required key that no section sets
            raise SpecError(f"{where}: [hold] or [config]: {_describe(first, RunConfig)}") from None
        if first["type"] == "extra_forbidden":
            detail = _describe(first, RunConfig).split(": ", 1)[1]
        else:
            detail = _describe({**first, "loc": ()}, RunConfig)
        raise SpecError(f"{where}: {origin}: {detail}") from None
    resolved = model.model_dump()
    deferred = (resolved["optimizer"], dict(origins), where)
    if optimizers is not None:
        optimizers.append(deferred)
    else:
        raise_first([deferred])
    return resolved


def _non_finite(value: Any, at: tuple[Any, ...] = ()) -> tuple[tuple[Any, ...], float] | None:
    """The location and value of the first infinite or NaN float in ``value``, else None."""
    if isinstance(value, float) and not math.isfinite(value):
        return at, value
    items = value.items() if isinstance(value, Mapping) else (
        enumerate(value) if isinstance(value, list | tuple) else ())
    for key, inner in items:
        found = _non_finite(inner, (*at, key))
        if found is not None:
            return found
    return None


def _finite(value: Any) -> bool:
    """False when ``value`` is, or holds, an infinite or NaN float."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, Mapping):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_finite(v) for v in value)
    return True


def _place(nested: dict[str, Any], key: str, value: Any, origins: Mapping[str, str],
           where: str) -> None:
    parts = key.split(".")
    node = nested
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SpecError(f"{where}: {origins[key]}: {part} is a value, not a table")
        node = child
    if isinstance(node.get(parts[-1]), dict):
        raise SpecError(f"{where}: {origins[key]}: {key} is a table of other keys")
    node[parts[-1]] = value


# -- messages -------------------------------------------------------------------------


# What a pattern means, in words (pydantic would print the regular expression).
PATTERN_WORDS = {
    NAME_PATTERN: "expected letters, digits, '.', '_' or '-' (at most 100, not starting "
    "with a symbol)",
    TASK_PATTERN: "expected a task reference package.module:factory",
    DURATION_PATTERN: "expected a duration such as 45s, 30m, 2h or 1d",
    r"^val/\S+$": "expected a validation metric such as val/accuracy",
    r"\S": "expected the question the campaign answers, not only spaces",
}
_UNION_TAGS = ("bool", "int", "float", "str")


def _first(error: ValidationError) -> dict[str, Any]:
    """The error to show: an unknown key first (a typo also explains a missing one)."""
    errors = error.errors()
    return next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])


def _quote_hint(names: list[str], table: Mapping[str, Any]) -> str:
    """``optimizer.lr = {...}`` unquoted is TOML's table ``optimizer`` holding ``lr``: the key
    path down to the table that holds a distribution, quoted, as the hint."""
    forms = ("log_uniform", "uniform", "int", "choice")
    while isinstance(table, Mapping) and len(table) == 1 and not set(table) & set(forms):
        (name, table), = table.items()
        names.append(str(name))
    return (f'; a dotted config key is quoted in [search.space]: "{".".join(names)}" = '
            "{ log_uniform = [...] }")


def _describe(error: Mapping[str, Any], model: type[BaseModel]) -> str:
    """One pydantic error as ``key.path: expected ...``."""
    raw_loc = list(error["loc"])
    loc = [
        p
        for p in raw_loc
        if not (isinstance(p, str) and (p in _UNION_TAGS or p.startswith(("list[", "function-"))))
    ]
    union = len(loc) != len(raw_loc)
    path = _path(loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        known = _known_keys(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"expected one of {', '.join(known)}"
        message = f"unknown key ({hint})"
        if loc[:2] == ["search", "space"] and len(loc) > 3 and isinstance(error.get("input"),
                                                                           dict):
            message += _quote_hint([str(p) for p in loc[2:]], error["input"])
    elif kind == "missing":
        message = "required key is missing"
    elif union:
        message = (
            f"expected a number, string, boolean or a list of them, got {error.get('input')!r}"
        )
    elif kind == "string_pattern_mismatch":
        pattern = error.get("ctx", {}).get("pattern", "")
        message = f"{PATTERN_WORDS.get(pattern, 'expected ' + pattern)}, got {error.get('input')!r}"
    elif kind == "too_short":
        message = "expected at least one item"
    elif kind == "model_type":
        message = f"expected a table of keys, got {error.get('input')!r}"
    else:
        text = error["msg"].replace("Input should be", "expected").replace("Value error, ", "")
        got = error.get("input")
        message = text if isinstance(got, dict | list) else f"{text}, got {got!r}"
    return f"{path}: {message}" if path else message


def _known_keys(model: type[BaseModel], loc: Sequence[Any]) -> list[str]:
    """The field names of the model found at ``loc`` (for "did you mean")."""
    current: Any = model
    keyed = False  # the last field was a table of names (search.space): skip one name
    for part in loc:
        if isinstance(part, int) or not _is_model(current) or keyed:
            keyed = False
            continue
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        annotation = field.annotation
        keyed = getattr(annotation, "__origin__", None) is dict
        candidates = (annotation, *getattr(annotation, "__args__", ()))
        current = next((a for a in candidates if _is_model(a)), None)
        if current is None:
            return []
    return list(current.model_fields) if _is_model(current) else []


def _is_model(candidate: Any) -> bool:
    return isinstance(candidate, type) and issubclass(candidate, BaseModel)


def _path(loc: Sequence[Any]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += ("." if path else "") + _quote(str(part))
    return path


def _quote(key: str) -> str:
    return f'"{key}"' if "." in key else key


def _format(value: Any) -> str:
    """Axis values in variant names, one way for every float: the shortest mantissa that
    reads back as the same float and a plain exponent (1e-3, 3e-4, 2.5e-4, 5e1,
    1.2345678e-3), so names sort and read alike whatever the magnitude and two different
    values never share a name; integers and words as written."""
    if isinstance(value, float):
        if value == 0 or not math.isfinite(value):
            return "0" if value == 0 else f"{value:g}"
        exact = Decimal(repr(value)).normalize()  # repr: the shortest round-tripping digits
        sign, digits, exponent = exact.as_tuple()
        text = "".join(map(str, digits))
        mantissa = text[0] + (f".{text[1:]}" if len(text) > 1 else "")
        return f"{'-' if sign else ''}{mantissa}e{int(exponent) + len(digits) - 1}"
    return str(value).lower() if isinstance(value, bool) else str(value)
