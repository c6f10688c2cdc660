"""The optimizer's settings, checked by torch itself (its signature, then building it over one
small parameter: a negative rate, a beta of 1.5 are torch's own refusals).

torch lives in the task host: a command defers each variant's check while it resolves the
spec and runs them all in one guarded child (:func:`raise_first`); building an optimizer over
no parameter checks its values without importing ``torch._dynamo`` (0.9 s)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from campaign.errors import SpecError
from campaign.host.calls import with_torch

# What one check is: the optimizer table, where each key came from, and the spec's path.
Deferred = tuple[dict[str, Any], Mapping[str, str], str]


def raise_first(deferred: Sequence[Deferred]) -> None:
    """:class:`SpecError` naming the key of the first optimizer setting torch refuses."""
    if not deferred:
        return
    problems = with_torch(problems_here, [options for options, _, _ in deferred],
                          what="checking the optimizer's settings")
    for (_, origins, where), problem in zip(deferred, problems, strict=True):
        if problem is not None:
            path, message = str(problem[0]), str(problem[1])
            origin = origins.get(path) or origins.get(path.rsplit(".", 1)[0]) or path
            raise SpecError(f"{where}: {origin}: {message}")


def problems_here(tables: list[dict[str, Any]]) -> list[tuple[str, str] | None]:
    """(key path, what is wrong) or None per optimizer table, in this process (torch)."""
    from campaign.loop.optim import optimizer_problem

    return [optimizer_problem(options) for options in tables]
