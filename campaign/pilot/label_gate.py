"""Labels where the loss sees them: the targets ``predict()`` reports from a collated batch.

Checking examples before ``collate`` proves nothing about what trains: a
collate that shifts every label (the examples look right, the loss trains the
wrong task) or sets every target to 0 passes any check of the raw examples,
and even the overfit gate, since ``predict`` scores against the same corrupted
targets. So this gate collates every example of every split (a seeded sample
of :data:`SAMPLE` per split for larger ones, said in the finding), asks the
task's ``predict()`` for its records, and compares each record's ``target``
with what the example says it is:

- ``classes[label]`` when the example has a ``label`` and the task a
  ``classes`` table (the conventions of docs/tasks.md);
- else, for a regression, the example's value under the task's ``target`` key (``"y"``:
  the field its loss reads, whatever its name);
- else the example's ``target`` (a generative task states its expected output).

A generative task whose ``predict()`` generates (slow: a model call per token)
may give ``targets_at_loss(batch)`` -> ``[(id, target)]``, the targets decoded
from the batch the loss sees; the gate then reads those instead of predicting.

It fails on any mismatch, naming ids and the first pairs (expected -> seen),
and on degenerate targets: a single target value at the loss in a split whose
examples hold several, or a numeric target with no variance.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from campaign.loop.task import TaskContract, check_records
from campaign.pilot.findings import Finding

SAMPLE = 2000  # examples checked per split; every one in smaller splits
CHUNK = 64


def check_targets(task: TaskContract, splits: Mapping[str, Sequence[dict[str, Any]]]) -> list[Any]:
    """One finding per split that has something to compare (see the module docstring)."""
    classes = getattr(task, "classes", None)
    key = _regression_key(task)
    model = _LazyModel(task)  # built only if predict() is asked (not for targets_at_loss)
    findings = []
    for name, examples in splits.items():
        # A label outside the class table is the labels_in_range check's finding.
        usable = [e for e in examples if not _out_of_range(e, classes)]
        chosen = _sample(usable, name)
        if not chosen:
            continue
        label = f"labels_at_loss[{name}]"
        try:
            seen, cut = _targets_at_loss(task, model, chosen)
        except Exception as error:  # the task's own code: a finding, not a crash
            findings.append(Finding(label, False, f"collate() or predict() failed: "
                                    f"{type(error).__name__}: {error}",
                                    "make predict() report every example's target"))
            continue
        # A target cut by max_length is the truncation check's finding.
        expected = {e["id"]: _expected(e, classes, key) for e in chosen if e["id"] not in cut}
        declared = f" (a seeded sample of {len(chosen)} of {len(examples)})" if len(
            chosen) < len(examples) else ""
        problem = _compare(expected, seen) or _degenerate(chosen, expected, seen)
        if problem:
            findings.append(Finding(label, False, problem + declared,
                                    "the targets the loss trains on are not the examples' "
                                    "labels: fix collate() (or the class table)"))
        else:
            compared = sum(v is not None for v in expected.values())
            what = (f"{compared} targets at the loss equal the examples' labels"
                    if compared else "no example states its label or target: not compared")
            findings.append(Finding(label, True, what + declared))
    return findings


class _LazyModel:
    """The task's model, built (in eval mode) on first use: a 7B base is not loaded for a
    gate that only decodes targets."""

    def __init__(self, task: TaskContract) -> None:
        self.task, self.model = task, None

    def get(self) -> torch.nn.Module:
        if self.model is None:
            self.model = self.task.model()
            self.model.eval()
        return self.model


def _sample(examples: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    if len(examples) <= SAMPLE:
        return examples
    return random.Random(f"labels-{split}").sample(examples, SAMPLE)


def _regression_key(task: TaskContract) -> str:
    """The example key a regression's target is read from: the task's ``target`` (the
    ``campaign.Task`` field its loss and predict() read, ``"y"`` say), else ``"target"``."""
    key = getattr(task, "target", None)
    regression = getattr(task, "kind", None) == "regression"
    return key if regression and isinstance(key, str) and key else "target"


def _expected(example: Mapping[str, Any], classes: Sequence[Any] | None,
              key: str = "target") -> Any:
    """The target strings ``predict()`` may report for ``example`` (the class name or the
    label id itself, a regression's value under ``key``), or None when the example states
    nothing to compare."""
    if "label" in example and classes is not None:
        label = int(example["label"])
        return (str(classes[label]), str(label)) if 0 <= label < len(classes) else None
    for name in dict.fromkeys((key, "target")):
        value = example.get(name)
        if isinstance(value, str):
            return (value,)
        if isinstance(value, int | float) or getattr(value, "ndim", 1) == 0:
            try:
                return (str(float(value)),)  # a number: compared as one (_matches)
            except (TypeError, ValueError):
                return None
    return None


def _matches(seen: str, accepted: tuple[str, ...]) -> bool:
    """Equal as text, or as numbers to float32 precision (a regression target)."""
    if seen in accepted:
        return True
    try:
        value = float(seen)
        return any(abs(value - float(a)) <= 1e-6 * max(1.0, abs(value)) for a in accepted)
    except ValueError:
        return False


def _out_of_range(example: Mapping[str, Any], classes: Sequence[Any] | None) -> bool:
    if "label" not in example or classes is None:
        return False
    return not 0 <= int(example["label"]) < len(classes)


@torch.no_grad()
def _targets_at_loss(task: TaskContract, model: _LazyModel,
                     examples: Sequence[dict[str, Any]]) -> tuple[dict[Any, str], set[Any]]:
    """(id -> target as predict() reports it, ids whose target max_length cut)."""
    seen: dict[Any, str] = {}
    cut: set[Any] = set()
    for start in range(0, len(examples), CHUNK):
        chunk = list(examples[start : start + CHUNK])
        batch = task.collate(chunk)
        flags = batch.get("target_cut") if isinstance(batch, Mapping) else None
        if flags is not None:
            cut |= {e["id"] for e, flag in zip(chunk, flags.tolist(), strict=True) if flag}
        decode = getattr(task, "targets_at_loss", None)
        if callable(decode):  # a generative task decodes its targets without generating
            seen.update((str(i), str(target)) for i, target in decode(batch))
            continue
        for record in check_records(task.predict(model.get(), batch)):
            seen[str(record["id"])] = str(record["target"])
    return seen, cut


def _compare(expected: Mapping[Any, Any], seen: Mapping[Any, str]) -> str | None:
    missing = [i for i in expected if str(i) not in seen]
    if missing:
        return (f"predict() reported no record for {len(missing)} examples: "
                f"{', '.join(map(repr, missing[:5]))}")
    wrong = [(i, e[0], seen[str(i)]) for i, e in expected.items()
             if e is not None and not _matches(seen[str(i)], e)]
    if not wrong:
        return None
    pairs = Counter((e, s) for _, e, s in wrong).most_common(4)
    shown = "; ".join(f"{e!r} -> {s!r} ({n})" for (e, s), n in pairs)
    ids = ", ".join(repr(i) for i, _, _ in wrong[:5])
    return (f"{len(wrong)} of {len(expected)} targets at the loss differ from the examples' "
            f"labels (expected -> seen: {shown}); first ids: {ids}")


def _degenerate(examples: Sequence[dict[str, Any]], expected: Mapping[Any, Any],
                seen: Mapping[Any, str]) -> str | None:
    values = set(seen.values())
    stated = {v[0] for v in expected.values() if v is not None}
    if len(values) == 1 and len(stated) > 1:
        return (f"every target at the loss is {next(iter(values))!r} while the examples "
                f"hold {len(stated)} different labels; first ids: "
                f"{', '.join(repr(e['id']) for e in examples[:5])}")
    if len(values) == 1 and not stated and len(examples) > 1 and _numeric(values):
        return (f"every target at the loss is {next(iter(values))} (no variance over "
                f"{len(examples)} examples)")
    return None


def _numeric(values: set[str]) -> bool:
    try:
        [float(v) for v in values]
    except ValueError:
        return False
    return True
