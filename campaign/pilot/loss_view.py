"""What the loss receives, example by example: the collated microbatch, not ``describe()``.

``describe()`` is the task's own account of an example; a collate that puts the prompt
into the loss once printed a correctly masked prompt there while the data gate, reading
the collated batch, failed ``prompt_out_of_loss``. ``campaign inspect`` therefore shows,
beside ``describe()``, every field of the collated batch at the example's row, as the
loss gets it: scalars as they are, sequences up to the row's length, targets with the
positions in the loss marked (``L``; ``.`` for ignored, -100), and, for a task that can
``decode(ids)``, the tokens decoded (what the loss learns to predict decoded on its own).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from campaign.pilot.data_gate import IGNORE

SHOWN = 64  # values of a sequence shown before "..."
TARGET_FIELDS = ("targets", "labels")  # masked fields by name, even when a row masks nothing


def loss_view(task: Any, examples: Sequence[dict[str, Any]], microbatch: int) -> list[dict]:
    """One dict per example: ``id`` and the collated fields at its row, collated in
    microbatches of ``microbatch`` exactly as training collates them."""
    rows: list[dict[str, str]] = []
    for start in range(0, len(examples), max(1, microbatch)):
        batch = task.collate(list(examples[start : start + microbatch]))
        rows += [_row(task, batch, i) for i in range(len(batch["ids"]))]
    return rows


def _row(task: Any, batch: dict[str, Any], index: int) -> dict[str, str]:
    import torch

    count = len(batch["ids"])
    row = {"id": str(batch["ids"][index])}
    lengths = batch.get("lengths")
    length = int(lengths[index]) if isinstance(lengths, torch.Tensor) else None
    decode = getattr(task, "decode", None)
    for field, value in batch.items():
        if field == "ids" or not isinstance(value, torch.Tensor) or value.dim() == 0:
            continue
        if value.shape[0] != count:
            row[field] = f"shape {list(value.shape)} (not per example)"
            continue
        item = value[index]
        if item.dim() == 0:
            row[field] = _scalar(item)
        elif item.dim() == 1:
            values = item[:length] if length is not None and item.shape[0] >= length else item
            masked = field in TARGET_FIELDS or bool((value == IGNORE).any())
            row.update(_sequence(field, values, decode, masked))
        else:
            row[field] = f"shape {list(item.shape)}"
    return row


def _scalar(item: Any) -> str:
    value = item.item()
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _sequence(field: str, values: Any, decode: Any, masked: bool) -> dict[str, str]:
    listed = values.tolist()
    integral = not values.is_floating_point()
    shown = " ".join(_scalar_text(v) for v in listed[:SHOWN]) + (" ..." if len(listed) > SHOWN
                                                                   else "")
    out = {field: f"[{len(listed)}] {shown}"}
    if integral and masked:
        out[f"{field} in loss"] = "".join("." if v == IGNORE else "L" for v in listed)
        learned = [v for v in listed if v != IGNORE]
        if callable(decode):
            out[f"{field} in loss, decoded"] = repr(decode(learned))
    elif integral and callable(decode):
        out[f"{field} decoded"] = repr(decode(listed))
    return out


def _scalar_text(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
