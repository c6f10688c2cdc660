"""The data gate's leakage and duplicate checks, over every example of every split.

Reading a sample of a large split misses leaks: on 31,033 examples a 20,000 sample passed a
split with one planted leak and named 111 of the 153 leaked names in a ported script's own
split. These checks need only each example's ``id`` and its leakage units (``group``,
``groups``), so they read those of every example, keeping nothing else
(docs/tasks.md, "Keys the gates read"):

- a task that can say them without building examples (lazy data, where an example is decoded
  or tokenized on access) gives ``example_keys(split)``: one ``{"id": ..., "group": ...}``
  (or ``"groups"``) per example, in the split's order;
- a task whose examples are costly to read, and that gives no keys, says
  ``costly_examples = True``: the checks then read the gate's seeded sample, and their own
  line says the chance that a leak is missed;
- any other task: every example is read (``dataset[i]``), its keys kept.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from campaign.pilot.findings import Finding

KEYS = ("id", "group", "groups")


@dataclass(frozen=True)
class Identities:
    """Each split's examples as the leakage checks see them, and what was not read."""

    splits: dict[str, list[dict[str, Any]]]
    sampled: dict[str, tuple[int, int]]  # split -> (examples read, examples in the split)
    given: bool = False  # by the task's example_keys

    def problems(self, datasets: Mapping[str, Any]) -> list[Finding]:
        """A task's ``example_keys`` that does not give one key per example fails the gate."""
        wrong = [f"{name}: {len(self.splits[name]):,} keys for {len(dataset):,} examples"
                 for name, dataset in datasets.items()
                 if self.given and len(self.splits[name]) != len(dataset)]
        return [Finding("example_keys", False, "; ".join(wrong),
                        "example_keys(split) gives one {'id', 'group'} per example, in order")
                ] if wrong else []

    def miss_note(self) -> str:
        """The chance a leak is missed, said where the checks read samples: a unit with one
        example in each of two splits is seen only when both are read (the worst pair)."""
        if not self.sampled:
            return ""
        fractions = {name: 1.0 for name in self.splits}
        fractions.update({name: read / size for name, (read, size) in self.sampled.items()})
        pairs = list(combinations(fractions.values(), 2)) or [(min(fractions.values()), 1.0)]
        missed = max(1 - a * b for a, b in pairs)
        read = ", ".join(f"{name} {n:,} of {size:,}" for name, (n, size) in self.sampled.items())
        return (f" (read on a seeded sample, the task's examples being costly: {read}; a leak "
                f"of one example in each of two splits is missed with probability {missed:.1%})")


def identities(task: Any, datasets: Mapping[str, Any],
               samples: Mapping[str, tuple[list[Any], str]]) -> Identities:
    """The id and leakage units of every example of every split (module docstring)."""
    given = getattr(task, "example_keys", None)
    costly = bool(getattr(task, "costly_examples", False))
    splits: dict[str, list[dict[str, Any]]] = {}
    sampled: dict[str, tuple[int, int]] = {}
    for name, dataset in datasets.items():
        examples, note = samples[name]
        if callable(given):
            splits[name] = _keys_of(given(name))
        elif not note:  # the gate's view is the whole split
            splits[name] = _keys_of(examples)
        elif costly:
            splits[name] = _keys_of(examples)
            sampled[name] = (len(examples), len(dataset))
        else:
            splits[name] = _keys_of(dataset[i] for i in range(len(dataset)))
    return Identities(splits, sampled, callable(given))


def _keys_of(examples: Iterable[Any]) -> list[dict[str, Any]]:
    return [{key: example[key] for key in KEYS if key in example} for example in examples]


def ids_unique(splits: Mapping[str, list[dict[str, Any]]], note: str = "") -> Finding:
    where: dict[Any, list[str]] = defaultdict(list)
    for name, examples in splits.items():
        for example in examples:
            where[example["id"]].append(name)
    repeated = {i: s for i, s in where.items() if len(s) > 1}
    if not repeated:
        total = sum(len(e) for e in splits.values())
        return Finding("ids_unique", True, f"{total} examples, every id unique{note}")
    shown = ", ".join(f"{i!r} ({'/'.join(s)})" for i, s in list(repeated.items())[:5])
    return Finding(
        "ids_unique", False, f"{len(repeated)} ids appear more than once: {shown}{note}",
        "give every example a stable, unique id (deduplicate the data)",
    )


def units(example: Mapping[str, Any]) -> list[Any]:
    """The leakage units an example belongs to: its ``group`` and every one of its ``groups``
    (a sliding window names each period its inputs and its target come from)."""
    found = [example["group"]] if "group" in example else []
    several = example.get("groups")
    if isinstance(several, list | tuple | set | frozenset):
        found += list(several)
    elif several is not None:
        found.append(several)
    return found


def groups_disjoint(splits: Mapping[str, list[dict[str, Any]]], note: str = "") -> Finding:
    seen: dict[Any, set[str]] = defaultdict(set)
    for name, examples in splits.items():
        for example in examples:
            for unit in units(example):
                seen[unit].add(name)
    if not seen:
        return Finding(
            "groups_disjoint", True,
            "no example has a 'group' or 'groups' key: leakage between splits (one "
            "conversation, patient or document in two splits) cannot be checked",
            "give every example a 'group' (what must never be split across train and val)",
            warning=True,
        )
    leaking = {g: sorted(s) for g, s in seen.items() if len(s) > 1}
    if not leaking:
        return Finding("groups_disjoint", True, f"{len(seen)} groups, each in one split{note}")
    shown = ", ".join(f"{g!r} ({'+'.join(s)})" for g, s in list(leaking.items())[:5])
    return Finding(
        "groups_disjoint", False, f"{len(leaking)} groups are in more than one split: "
        f"{shown}{note}",
        "split by group (conversation, patient, document, period), not by example",
    )
