"""Where gradient accumulation is not one big batch: layers that normalise by batch statistics.

The loop sums per-unit losses over the microbatches of an update and divides by all their
units, so with accumulation the gradient is the big batch's exactly, for every layer that
treats examples independently. A BatchNorm (or any module with running statistics)
normalises each microbatch by its own mean and variance: 2 microbatches of 8 are not one
batch of 16 (measured on a BatchNorm MLP: loss 1.2303 against 1.2619, gradients apart by
up to 2.28), and variants whose microbatch differs differ in their statistics too, not only
in the key they set. ``plan`` and the pilot say so; nothing is refused (it may be what the
user wants), but the README's claim is true only without such layers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def batch_stat_layers(model: Any) -> list[str]:
    """``name (Type)`` of every module that keeps running batch statistics."""
    found = []
    for name, module in model.named_modules():
        if getattr(module, "track_running_stats", False) and (
            getattr(module, "running_mean", None) is not None
        ):
            found.append(f"{name or '(model)'} ({type(module).__name__})")
    return found


def layers_on_meta(task: Any) -> list[str] | None:
    """The batch-statistics layers of ``task.model()`` built on the meta device (no memory,
    no weights loaded); None when the model cannot be built that way."""
    import torch

    try:
        with torch.device("meta"):
            model = task.model()
    except Exception:  # a model that needs real tensors to build: the pilot says it instead
        return None
    return batch_stat_layers(model)


def accumulation_warning(layers: list[str], configs: Iterable[Mapping[str, Any]]) -> str | None:
    """The warning for ``layers`` under the variants' ``loop`` settings, or None."""
    if not layers:
        return None
    loops = [dict(c.get("loop") or {}) for c in configs]
    accumulated = sorted({int(lp.get("accumulation", 1)) for lp in loops} - {1})
    microbatches = sorted({int(lp.get("microbatch", 1)) for lp in loops})
    reasons = []
    if accumulated:
        reasons.append(f"accumulation {', '.join(map(str, accumulated))} normalises each "
                       "microbatch by its own statistics, so an update is not one big batch's "
                       "gradient")
    if len(microbatches) > 1:
        reasons.append(f"variants with microbatch {', '.join(map(str, microbatches))} also "
                       "differ in their batch statistics, not only in the key they set")
    if not reasons:
        return None
    more = f" and {len(layers) - 2} more" if len(layers) > 2 else ""
    return (f"the model has batch-statistics layers ({', '.join(layers[:2])}{more}): "
            + "; ".join(reasons))
