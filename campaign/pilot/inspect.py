"""``campaign inspect``: examples as the loss receives them, and a summary of the split.

What the loss sees is what matters: the decoded input, the target, the
positions or label that contribute, the length, padding and truncation. The
summary counts lengths, padding and labels over the whole split, collated in
microbatches exactly as training will.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from campaign.loop.data import gate_view, rows
from campaign.loop.task import TaskContract
from campaign.pilot.loss_view import loss_view

if TYPE_CHECKING:
    pass


def examples(task: TaskContract, split: str, count: int) -> list[dict[str, Any]]:
    """``describe`` of the first ``count`` examples, with their id."""
    chosen = rows(task.splits()[split], 0, count)
    return [{"id": e["id"], **task.describe(e)} for e in chosen]


def summary(task: TaskContract, split: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """Counts over the whole split, collated with the run's microbatch."""
    dataset = task.splits()[split]
    data, note = gate_view(dataset)
    microbatch = int(config.get("loop", {}).get("microbatch", 1))
    lengths: list[int] = []
    padded = cut = 0
    for start in range(0, len(data), microbatch):
        batch = task.collate(data[start : start + microbatch])
        if "lengths" in batch:
            row_lengths = [int(v) for v in batch["lengths"]]
            lengths += row_lengths
            padded += max(row_lengths) * len(row_lengths)
        if "target_cut" in batch:
            cut += int(batch["target_cut"].sum())
    result: dict[str, Any] = {"split": split, "examples": len(dataset), "microbatch": microbatch}
    if note:
        result["summarised_on"] = note
    if lengths:
        result |= {
            "length_min": min(lengths),
            "length_median": statistics.median(lengths),
            "length_max": max(lengths),
            "padding_fraction": round(1 - sum(lengths) / padded, 4) if padded else 0.0,
            "targets_cut_by_max_length": cut,
        }
    classes = getattr(task, "classes", None)
    labels = Counter(int(e["label"]) for e in data if "label" in e)
    if labels:

        def name(label: int) -> str:
            if classes is not None and 0 <= label < len(classes):
                return f"{label} ({classes[label]})"
            return str(label)

        result["label_counts"] = {name(i): labels[i] for i in sorted(labels)}
    return result


def inspect_task(reference: str, config: dict[str, Any], campaign: str, split: str,
                 count: int) -> dict[str, Any]:
    """The task side of :func:`campaign.pilot.inspect_hosted.inspect_campaign` (run in a
    guarded child of the task host)."""
    from campaign.loop.task import build_task
    from campaign.pilot.data_gate import check_data, passed

    task = build_task(reference, config)
    names = list(task.splits())
    if split not in names:
        from campaign.errors import LedgerInputError

        raise LedgerInputError(f"--split {split!r}: the task's splits are {', '.join(names)}")
    findings = check_data(task, config)
    shown = rows(task.splits()[split], 0, count)
    microbatch = int(config.get("loop", {}).get("microbatch", 1))
    return {
        "campaign": campaign,
        "examples": examples(task, split, count),
        "loss_view": loss_view(task, shown, microbatch),
        "summary": summary(task, split, config),
        "data_gate": [
            {
                "check": f.check,
                "verdict": ("warning" if f.warning else "pass") if f.ok else "FAIL",
                "detail": f.detail,
                "advice": f.advice,
            }
            for f in findings
        ],
        "passed": passed(findings),
    }
