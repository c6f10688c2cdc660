"""``campaign plan SPEC --set KEY=VALUE``: the spec file's keys overridden from the command line.

Users of Hydra, LightningCLI and torchtune type ``key=value``; here an override
is placed into the spec document before it is validated, so it is typed and
checked exactly as the file's own keys are, and the frozen spec (what the ledger
stores and hashes) is the file with its overrides (docs/spec.md, "Overrides from
the command line"). Nothing is written by this module.

Where a KEY goes:

- ``SECTION.NAME`` for the spec's own sections (``campaign.name``,
  ``grid.seeds``, ``validation.every``, ``stop.NAME``, ``pilot.NAME``,
  ``search.NAME`` such as ``search.keep``; the space is edited in the file);
  ``hold.KEY`` / ``config.KEY`` / ``grid.axes.KEY`` name a dotted config key of
  that table;
- any other KEY is a dotted config key (``optimizer.lr``): it replaces the
  file's ``[hold]`` entry when the key is held there, else it goes to
  ``[config]``, the control's config, which variants inherit unless they set the
  key themselves.

``grid.variants`` (an array of tables) is not addressable: edit the file.
"""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Sequence
from typing import Any

from campaign.errors import SpecError

SECTIONS = ("campaign", "hold", "config", "validation", "stop", "grid", "pilot", "search")
DOTTED_TABLES = ("hold", "config")  # tables whose names are dotted config keys
MAX_SET_CHARS = 10_000
_KEY = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def parse_set(item: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE in TOML's syntax (a bare word is a string); one line naming
    the item when it is not one."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SpecError(f"--set {item!r}: expected KEY=VALUE, e.g. optimizer.lr=3e-4")
    if len(item) > MAX_SET_CHARS:
        raise SpecError(f"--set {key[:40]!r}: the value is {len(item):,} characters long: "
                        "not a setting")
    try:
        value = tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        value = text.strip()  # a bare word such as adamw is a string
    except RecursionError:
        raise SpecError(f"--set {key!r}: nested too deeply") from None
    if isinstance(value, dict) and key.startswith("search.space"):
        raise SpecError(f"--set {item!r}: a search's space is edited in the file's "
                        "[search.space] (--set sets search.NAME, such as search.keep=0.5)")
    if isinstance(value, dict):
        raise SpecError(f"--set {item!r}: one value per key, not a table "
                        f"(e.g. --set {key}.NAME=VALUE)")
    return key, value


def apply_sets(document: dict[str, Any], items: Sequence[str]) -> tuple[dict[str, Any],
                                                                         dict[str, str]]:
    """The spec ``document`` with each ``--set`` applied (a copy), and for each key path as an
    error message writes it (``config."optimizer.lr"``) the ``--set KEY`` that put it there."""
    merged = copy.deepcopy(document)
    origins: dict[str, str] = {}
    seen: dict[str, str] = {}
    for item in items:
        key, value = parse_set(item)
        if not _KEY.fullmatch(key):
            raise SpecError(f"--set {key!r}: a key is dotted names (letters, digits, _), "
                            "e.g. optimizer.lr or grid.seeds")
        path = _place(merged, key, value)
        if path in seen:  # the same key twice, however spelt (optimizer.lr, config.optimizer.lr)
            again = "" if seen[path] == key else f" (as --set {seen[path]})"
            raise SpecError(f"--set {key}: given more than once{again}")
        seen[path] = key
        origins[path] = f"--set {key}"
    return merged, origins


def _place(document: dict[str, Any], key: str, value: Any) -> str:
    """Put ``value`` where ``key`` addresses; returns the key path as errors name it."""
    head, _, rest = key.partition(".")
    if head in SECTIONS and rest:
        table = _table(document, head, key)
        if head in DOTTED_TABLES:
            if head == "config":
                _refuse_shadowed(document, rest, key)
            else:
                _refuse_free(document, rest, key)
            table[rest] = value
            return f'{head}."{rest}"'
        if head == "grid" and rest.split(".")[0] == "variants":
            raise SpecError(f"--set {key}: grid.variants is a list of tables, not settable "
                            "from the command line (edit the spec file)")
        if head == "grid" and rest.startswith("axes."):
            _table(document["grid"], "axes", key)[rest[len("axes."):]] = value
            return f'grid.axes."{rest[len("axes."):]}"'
        parts = rest.split(".")
        for part in parts[:-1]:
            table = _table(table, part, key)
        table[parts[-1]] = value
        return ".".join((head, *parts))
    if key in (document.get("hold") or {}):
        document["hold"][key] = value
        return f'hold."{key}"'
    if key in ("seed", "seeds"):
        raise SpecError(f"--set {key}: a run's seed is one of grid.seeds "
                        "(e.g. --set grid.seeds=[0,1,2])")
    _refuse_shadowed(document, key, key)
    _table(document, "config", key)[key] = value
    return f'config."{key}"'


def _varied_by(document: dict[str, Any], key: str) -> tuple[bool, list[bool]]:
    """Whether ``grid.axes`` varies ``key``, and for each variant whether its ``set`` does."""
    grid = document.get("grid") if isinstance(document.get("grid"), dict) else {}
    variants = [v for v in grid.get("variants") or [] if isinstance(v, dict)]
    return key in (grid.get("axes") or {}), [key in (v.get("set") or {}) for v in variants]


def _refuse_shadowed(document: dict[str, Any], key: str, given: str) -> None:
    """A config key every variant sets itself: the control's ``[config]`` value would reach no
    run, and an override that changes nothing must not pass for one."""
    on_axis, in_sets = _varied_by(document, key)
    if on_axis:
        raise SpecError(f"--set {given}: grid.axes varies {key} across the variants; the "
                        f"override would change no run (set grid.axes.{key}=[...] instead)")
    if in_sets and all(in_sets):
        raise SpecError(f"--set {given}: every variant sets {key} itself "
                        "(grid.variants[*].set); the override would change no run (edit the "
                        "variants in the file)")


def _refuse_free(document: dict[str, Any], key: str, given: str) -> None:
    """``--set hold.KEY`` of a key the file leaves free (the control's ``[config]``, an axis,
    a variant's ``set``): a key is either held or free, and the override names which."""
    on_axis, in_sets = _varied_by(document, key)
    in_config = key in (document.get("config") or {})
    where = ("grid.axes" if on_axis else "[config]" if in_config else
             "a variant's set" if any(in_sets) else None)
    if where:
        settable = where == "[config]" and not (in_sets and all(in_sets))  # as shadowed allows
        instead = f"--set {key}=VALUE sets the control's value" if settable else "edit the file"
        raise SpecError(f"--set {given}: {key} is free in the spec ({where}); a key is either "
                        f"held or free ({instead})")


def _table(parent: dict[str, Any], name: str, key: str) -> dict[str, Any]:
    """``parent[name]``, a table (made when absent); one line when the spec has a value
    there."""
    table = parent.setdefault(name, {})
    if not isinstance(table, dict):
        raise SpecError(f"--set {key}: {name} is not a table in the spec")
    return table


def named(message: str, where: str, origins: dict[str, str]) -> str:
    """A refusal that names a key path an override put there says the override instead
    (``spec.toml: --set optimizer.lr: expected a number ...``)."""
    for path, given in sorted(origins.items(), key=lambda item: -len(item[0])):
        # config."seed" is written config.seed where it needs no quotes; a task's own refusal
        # names the bare key (campaign.task: task.hiddn: ...)
        bare = path.replace('"', "")
        key = path.split('"')[1] if '"' in path else bare  # config."task.x" -> task.x
        for prefix in (f"{where}: {path}", f"{where}: {bare}", f"{where}: campaign.task: {key}"):
            if message.startswith(prefix) and message[len(prefix):len(prefix) + 1] in (
                    ":", "[", ".", " "):
                return f"{where}: {given}{message[len(prefix):]}"
    return message
