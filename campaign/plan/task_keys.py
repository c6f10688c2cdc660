"""``task.*`` keys checked at ``plan`` against the schema a task declares (``TASK_KEYS``).

The check runs where task code runs (the guarded child of :func:`campaign.plan.task_facts.
task_facts`): finding the schema imports the task's module. The answer is the first
problem as (dotted key under ``task``, message); the command names the spec section the
key came from (:func:`origin`).
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from campaign.loop.taskref import load_factory


def declared_schema(reference: str) -> type[BaseModel] | None:
    """The ``TASK_KEYS`` model on the factory or in its module; None when not declared."""
    factory = load_factory(reference)
    found = getattr(factory, "TASK_KEYS", None)
    if found is None:
        found = getattr(sys.modules.get(getattr(factory, "__module__", ""), None), "TASK_KEYS",
                        None)
    return found if isinstance(found, type) and issubclass(found, BaseModel) else None


def task_keys_problem(reference: str, configs: Sequence[Mapping[str, Any]]) -> list[str] | None:
    """``[key, message, index]`` for the first config whose ``task`` table the declared
    schema refuses (an unknown key first: a typo also explains a missing one); ``index``, its
    place in ``configs`` (as text: the answer crosses a host child as JSON)."""
    schema = declared_schema(reference)
    if schema is None:
        return None
    for index, config in enumerate(configs):
        try:
            schema.model_validate(dict(config.get("task") or {}))
        except ValidationError as error:
            errors = error.errors()
            first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
            members = _union_members(errors, first)
            if len(members) > 1:  # a value of none of a union's types: say every one
                wanted = " or ".join(_message(e, schema).split(", got ")[0].removeprefix(
                    "expected ") for e in members)
                return [str(first["loc"][0]), f"expected {wanted}, got {first.get('input')!r}",
                        str(index)]
            key = ".".join(str(part) for part in first["loc"])
            return [key, _message(first, schema), str(index)]
    return None


def _union_members(errors: Sequence[Mapping[str, Any]],
                   first: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The errors of ``first``'s field that pydantic gives per member of a union type (their
    location's second part names the member: ``list[str]``, ``literal['all-linear']``)."""
    loc = first["loc"]
    if len(loc) != 2 or isinstance(loc[1], int):
        return [first]
    return [e for e in errors if len(e["loc"]) == 2 and e["loc"][0] == loc[0]
            and not isinstance(e["loc"][1], int)]


def _message(error: Mapping[str, Any], schema: type[BaseModel]) -> str:
    if error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
        known = [field.alias or name for name, field in schema.model_fields.items()]
        close = difflib.get_close_matches(str(error["loc"][0]), known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"expected one of {', '.join(known)}"
        return f"unknown key of this task ({hint})"
    text = error["msg"].replace("Input should be", "expected").replace("Value error, ", "")
    return f"{text}, got {error.get('input')!r}"


def origin(document: Mapping[str, Any], key: str) -> str:
    """Where the spec sets ``task.KEY``: ``config."task.KEY"``, ``grid.variants[1].set...``."""
    dotted = f"task.{key}"
    head = dotted.split(".")[:2]
    for section in ("hold", "config"):
        for name in document.get(section) or {}:
            if name.split(".")[:2] == head:
                return f'{section}."{name}"'
    grid = document.get("grid") or {}
    for index, variant in enumerate(grid.get("variants") or []):
        for name in variant.get("set") or {}:
            if name.split(".")[:2] == head:
                return f'grid.variants[{index}].set."{name}"'
    for name in grid.get("axes") or {}:
        if name.split(".")[:2] == head:
            return f'grid.axes."{name}"'
    for name in (document.get("search") or {}).get("space") or {}:
        if name.split(".")[:2] == head:
            return f'search.space."{name}"'
    return f'"{dotted}"'
