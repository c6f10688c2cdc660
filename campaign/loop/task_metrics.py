"""Metrics a task logs itself: ``self.log(name, value)`` (or ``campaign.log_metric``) from its
``loss`` and ``predict`` code, beside the loop's own keys (docs/tasks.md, "Metrics a task logs").

The loop opens a collection around each update's forward-backward (phase ``train``),
each validation (``val``) and the training-sample estimate (``train_eval``). A name
already under one of those (``train/acc``, ``val/f1``, as Lightning users write them)
is kept as it is in that phase and ignored in the others (validation calls ``loss()``
too); any other is put under the phase it was logged in. What an update
or a validation logged is its weighted mean (``weight`` per call, 1 by default: a
microbatch's accuracy weighted by its examples, say), over every rank's
microbatches on a run of several ranks (there, only the names the task declares in
``logged_metrics``: every rank must gather the same set); the ledger gets one point
per key per update or validation. Outside a collection (the pilot's gates, a replay, the
task's own tests) a call does nothing, and a sharded rank's zero-weight filler
microbatch logs nothing.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from campaign.errors import LoopError

PHASES = ("train", "val", "train_eval")
# The loop's own keys: a task's value must not pass for one of them.
LOOP_KEYS = frozenset({"train/loss", "train/grad_norm", "train/units", "train/data_wait_s",
                       "train/lr", "train/update_s", "val/loss", "train_eval/loss"})
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-/]{0,99}")


class Collected:
    """What one update or validation logged: per key, (weighted sum, total weight)."""

    def __init__(self, phase: str, declared: Sequence[str] | None = None) -> None:
        self.phase = phase
        self.declared = None if declared is None else frozenset(declared)
        self.sums: dict[str, list[float]] = {}

    def add(self, name: str, value: Any, weight: Any) -> None:
        """Count one logged value (see the module for which name lands where)."""
        key = key_for(name, self.phase)
        if key is None:  # another phase's name (validation calls loss() too): not this one's
            return
        if self.declared is not None and key not in self.declared:
            raise LoopError(f"task metric {name!r}: a run of several ranks records the metrics "
                            f"its task declares, gathered from every rank (add {name!r} to the "
                            "task's logged_metrics)")
        number, share = _number(value, name), _number(weight, f"{name} (its weight)")
        if not (math.isfinite(share) and share >= 0):
            raise LoopError(f"task metric {name!r}: weight must be a finite number >= 0, "
                            f"got {share!r}")
        if share == 0:  # a microbatch with nothing to count (every token masked out)
            return
        entry = self.sums.setdefault(key, [0.0, 0.0])
        entry[0] += number * share
        entry[1] += share

    def means(self) -> dict[str, float]:
        """Each key's weighted mean over what was counted."""
        return combined([self.sums])


_active: Collected | None = None
_paused = 0


def key_for(name: str, phase: str) -> str | None:
    """The ledger key of ``name`` logged in ``phase``: None for a name under another phase
    (``train/acc`` logged from ``loss()`` while validation calls it); one line naming it when
    it cannot be a key."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise LoopError(f"task metric {name!r}: a name is 1 to 100 letters, digits and _ . - /")
    prefix = name.split("/", 1)[0] if "/" in name else None
    if prefix in PHASES and prefix != phase:
        return None
    key = name if prefix in PHASES else f"{phase}/{name}"
    if key in LOOP_KEYS:
        raise LoopError(f"task metric {name!r}: {key} is the loop's own (log it under another "
                        "name)")
    return key


def _number(value: Any, name: str) -> float:
    """A plain float of a Python or NumPy number or a one-element tensor (``.item()``: on a
    GPU, one device sync per call)."""
    item = getattr(value, "item", None)
    if callable(item):
        try:
            value = item()
        except (RuntimeError, ValueError):
            raise LoopError(f"task metric {name!r}: a tensor of one element, got shape "
                            f"{tuple(getattr(value, 'shape', ()))}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LoopError(f"task metric {name!r}: a number, got {type(value).__name__}")
    return float(value)  # NaN and inf kept: the ledger stores what the task saw


def log_metric(name: str, value: Any, weight: float = 1.0) -> None:
    """Log ``value`` under ``name`` for the current update or validation (see the module)."""
    if _active is not None and not _paused:
        _active.add(name, value, weight)


@contextlib.contextmanager
def collecting(phase: str, declared: Sequence[str] | None = None) -> Iterator[Collected]:
    """Collect what the task logs while the block runs (one update, one validation); with
    ``declared``, only those keys (a run of several ranks gathers a fixed set, and only when
    the task declares one: no collective per update for a task that logs nothing)."""
    global _active
    outer, _active = _active, Collected(phase, declared)
    try:
        yield _active
    finally:
        _active = outer


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Nothing logged counts while the block runs (a zero-weight filler microbatch)."""
    global _paused
    _paused += 1
    try:
        yield
    finally:
        _paused -= 1


def combined(parts: Sequence[Mapping[str, Sequence[float]]]) -> dict[str, float]:
    """The weighted means over several collections' sums (every rank's, in rank order)."""
    totals: dict[str, list[float]] = {}
    for part in parts:
        for key, (weighted, weight) in part.items():
            entry = totals.setdefault(key, [0.0, 0.0])
            entry[0] += weighted
            entry[1] += weight
    return {key: weighted / weight for key, (weighted, weight) in sorted(totals.items())
            if weight > 0}


def declared_names(task: Any) -> list[str]:
    """The keys a task declares it logs (``logged_metrics``: names as it logs them; a bare
    name may be logged in training and in validation, so both keys are counted)."""
    declared = getattr(task, "logged_metrics", None)
    if isinstance(declared, str):  # one name, written without the tuple's comma
        declared = (declared,)
    if not isinstance(declared, list | tuple):
        return []
    keys: list[str] = []
    for name in declared:
        if not isinstance(name, str):
            continue
        if "/" in name and name.split("/", 1)[0] in PHASES:
            keys.append(name)
        else:
            keys += [f"train/{name}", f"val/{name}"]
    return keys
