"""The data gate: what must hold of the examples before any training step means anything.

Each check returns a :class:`Finding` that names what was wrong, with the
examples, ids or groups at fault, and what to do about it. The checks use
only the task contract and the conventions of its batches (``targets`` with
-100 for "not in the loss", ``lengths``, ``prompt_lengths``, ``target_cut``)
and examples (``id``, ``group``, ``label``, ``class_name``), so a user's task
gets them by following the same conventions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from campaign.loop.data import gate_view
from campaign.loop.task import TaskContract
from campaign.pilot.findings import Finding
from campaign.pilot.label_gate import check_targets
from campaign.pilot.leakage import groups_disjoint, identities, ids_unique
from campaign.pilot.randomness import declared_randomness, own_order

IGNORE = -100
CHUNK = 64


def gate_samples(datasets: Mapping[str, Any]) -> dict[str, tuple[list[Any], str]]:
    """Each split's examples as the gate reads them (:func:`gate_view`: all of a split up to
    :data:`GATE_SAMPLE`, a seeded sample beyond) and the words that say so. The pilot reads
    them once, for this gate, its longest examples and its overfit check's examples."""
    return {name: gate_view(dataset) for name, dataset in datasets.items()}


def check_data(
    task: TaskContract,
    config: Mapping[str, Any],
    *,
    datasets: Mapping[str, Any] | None = None,
    samples: Mapping[str, tuple[list[Any], str]] | None = None,
) -> list[Finding]:
    """Run every data check; the gate passes when every finding is ok.

    A split larger than :data:`GATE_SAMPLE` examples is checked on a seeded random sample
    of that many (a lazy dataset of millions is never collated whole), and a finding says so;
    ids and groups are read of every example (:mod:`campaign.pilot.leakage`).
    ``datasets``: the task's splits, already asked for; ``samples``: their
    :func:`gate_samples`, already read.
    """
    datasets = task.splits() if datasets is None else datasets
    samples = gate_samples(datasets) if samples is None else samples
    splits = {name: examples for name, (examples, _) in samples.items()}
    notes = [f"{name}: {note}" for name, (_, note) in samples.items() if note]
    batches = {name: _collated(task, examples) for name, examples in splits.items()}
    allow_cut = bool(config.get("loop", {}).get("allow_target_truncation", False))
    keys = identities(task, datasets, samples)
    read = ("ids and groups of every example read" if not keys.sampled
            else "ids and groups sampled too: the task's examples are costly")
    sampled = [Finding("sampled", True, "labels, targets and batches checked on "
                       + "; ".join(notes) + f" ({read})")] if notes else []
    return [
        *sampled,
        *keys.problems(datasets),
        ids_unique(keys.splits, keys.miss_note()),
        groups_disjoint(keys.splits, keys.miss_note()),
        *_labels(task, splits),
        *check_targets(task, splits),
        _masks_match_lengths(batches),
        _prompt_out_of_loss(batches, splits),
        _truncation(batches, allow_cut),
        declared_randomness(task, datasets["train"]),
        *own_order(task, config, datasets["train"]),
    ]


def passed(findings: Sequence[Finding]) -> bool:
    return all(f.ok for f in findings)


def _collated(task: TaskContract, examples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [task.collate(examples[i : i + CHUNK]) for i in range(0, len(examples), CHUNK)]


def _labels(task: TaskContract, splits: Mapping[str, list[dict[str, Any]]]) -> list[Finding]:
    classes = getattr(task, "classes", None)
    examples = [e for split in splits.values() for e in split if "label" in e]
    if classes is None and not examples:  # not a classification task
        return [Finding("labels", True, "no example has a 'label': no class table to check")]
    if classes is None or not examples:
        why = ("the examples have a 'label' but the task has no 'classes' table"
               if classes is None else "the task has 'classes' but no example has a 'label'")
        return [Finding("labels", True, f"{why}: label ids are not checked against class names",
                        "see docs/tasks.md, 'What the data gate checks'", warning=True)]
    out_of_range = [e["id"] for e in examples if not 0 <= int(e["label"]) < len(classes)]
    findings = [
        Finding(
            "labels_in_range",
            not out_of_range,
            f"{len(out_of_range)} labels outside 0..{len(classes) - 1}: "
            f"{', '.join(map(repr, out_of_range[:5]))}"
            if out_of_range
            else f"every label in 0..{len(classes) - 1}",
            "fix the label encoding or the number of classes" if out_of_range else "",
        )
    ]
    named = [e for e in examples if "class_name" in e and 0 <= int(e["label"]) < len(classes)]
    if named:
        wrong = Counter(
            (int(e["label"]), e["class_name"])
            for e in named
            if str(classes[int(e["label"])]) != str(e["class_name"])
        )
        if wrong:
            ids = [e["id"] for e in named if str(classes[int(e["label"])]) != str(e["class_name"])]
            shown = ", ".join(
                f"label {label} -> class {classes[label]!r} but the data says "
                f"{name!r} ({count} examples)"
                for (label, name), count in wrong.most_common(4)
            ) + f"; first ids: {', '.join(map(repr, ids[:5]))}"
            findings.append(
                Finding(
                    "class_mapping",
                    False,
                    shown,
                    "the label id <-> class name table is wrong: fix it",
                )
            )
        else:
            findings.append(
                Finding(
                    "class_mapping", True, f"label ids match class names for {len(named)} examples"
                )
            )
    return findings


def _masks_match_lengths(batches: Mapping[str, list[dict[str, Any]]]) -> Finding:
    bad, rows = [], 0
    for batch in (b for split in batches.values() for b in split):
        if "targets" not in batch or "lengths" not in batch:
            continue
        targets, lengths = batch["targets"], batch["lengths"]
        positions = torch.arange(targets.shape[1]).unsqueeze(0)
        beyond = (positions >= lengths.unsqueeze(1)) & (targets != IGNORE)
        empty = ((targets != IGNORE) & (positions < lengths.unsqueeze(1))).sum(dim=1) == 0
        for row in torch.nonzero(beyond.any(dim=1) | empty).flatten().tolist():
            bad.append(batch["ids"][row])
        rows += len(lengths)
    if rows == 0:
        return Finding("masks_match_lengths", True, "batches carry no lengths: nothing to check")
    if bad:
        return Finding(
            "masks_match_lengths",
            False,
            f"{len(bad)} examples with loss targets in the padding or none at all: "
            f"{', '.join(map(repr, bad[:5]))}",
            "mask padding with -100 and keep at least one target per example",
        )
    return Finding("masks_match_lengths", True, f"{rows} examples: targets only within lengths")


def _prompt_out_of_loss(batches: Mapping[str, list[dict[str, Any]]],
                        splits: Mapping[str, list[dict[str, Any]]]) -> Finding:
    unbounded = [name for name, split in batches.items()
                 if any("targets" in b and "prompt_lengths" not in b for b in split)
                 and any("prompt" in e for e in splits.get(name, []))]
    if unbounded:  # the prompt may be in the loss and nothing could tell
        return Finding(
            "prompt_out_of_loss", False,
            f"the {'/'.join(unbounded)} examples have a 'prompt' but their batches give "
            "token targets without 'prompt_lengths': whether the prompt is in the loss "
            "cannot be checked",
            "give each batch 'prompt_lengths' (the prompt's tokens per row) and set the "
            "prompt's targets to -100",
        )
    leaking, rows = [], 0
    for batch in (b for split in batches.values() for b in split):
        if "targets" not in batch or "prompt_lengths" not in batch:
            continue
        targets = batch["targets"]
        positions = torch.arange(targets.shape[1]).unsqueeze(0)
        # the target at position p is token p + 1: prompt tokens are targets at
        # positions before prompt_length - 1
        in_prompt = positions < (batch["prompt_lengths"].unsqueeze(1) - 1)
        hit = (in_prompt & (targets != IGNORE)).any(dim=1)
        leaking += [batch["ids"][r] for r in torch.nonzero(hit).flatten().tolist()]
        rows += len(targets)
    if rows == 0:
        return Finding("prompt_out_of_loss", True, "no prompts: nothing to check")
    if leaking:
        return Finding(
            "prompt_out_of_loss",
            False,
            f"{len(leaking)} examples put prompt tokens into the loss: "
            f"{', '.join(map(repr, leaking[:5]))}",
            "set the prompt's targets to -100: only the answer is learned",
        )
    return Finding("prompt_out_of_loss", True, f"{rows} examples: prompt tokens masked out")


def _truncation(batches: Mapping[str, list[dict[str, Any]]], allowed: bool) -> Finding:
    cut = [
        batch["ids"][r]
        for split in batches.values()
        for batch in split
        if "target_cut" in batch
        for r in torch.nonzero(batch["target_cut"]).flatten().tolist()
    ]
    if not cut:
        return Finding("truncation", True, "max_length cuts no target")
    detail = f"max_length cuts the target of {len(cut)} examples: {', '.join(map(repr, cut[:5]))}"
    if allowed:
        return Finding("truncation", True, detail + " (allowed by loop.allow_target_truncation)")
    return Finding(
        "truncation",
        False,
        detail,
        "raise loop.max_length, drop those examples, or set "
        "loop.allow_target_truncation = true in [hold]",
    )
