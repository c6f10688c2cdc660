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

import contextlib
from collections.abc import Iterable, Mapping
from typing import Any


def batch_stat_layers(model: Any) -> list[str]:
    """``name (Type)`` of every module that normalises by batch statistics: any BatchNorm
    (``track_running_stats=False`` included: it normalises by the batch's statistics in
    evaluation too), SyncBatchNorm, and any other module that keeps running statistics."""
    from torch.nn.modules.batchnorm import _BatchNorm

    found = []
    for name, module in model.named_modules():
        if isinstance(module, _BatchNorm) or (
            getattr(module, "track_running_stats", False)
            and getattr(module, "running_mean", None) is not None
        ):
            found.append(f"{name or '(model)'} ({type(module).__name__})")
    return found


def coupled_layers(task: Any, model: Any, examples: list[Any], device: Any,
                   autocast: Any = contextlib.nullcontext, microbatch: int = 1) -> list[str]:
    """The first module (in the order the forward runs them) whose output for an example
    depends on the other examples of its batch: a task's own layer that reduces over the
    batch dimension, which no type can name. One microbatch of ``examples`` goes through the
    task's loss alone and then with a second beside it, in training mode with dropout off;
    where the first microbatch's rows differ the layer couples examples. Only a fingerprint
    of each output is kept (each row's sum and sum of magnitudes, in float64: a model's
    activations are never held), and the rows are compared within the tolerance of the
    autocast's precision. Nothing is left changed: buffers (running statistics) and every
    generator (Python's, NumPy's, torch's CPU and CUDA) are restored; outputs whose shape
    depends on the batch (padding to the longest) are not compared."""
    import random

    import numpy as np
    import torch

    from campaign.loop.data import to_device

    half = max(1, min(int(microbatch), len(examples) // 2))
    if len(examples) < 2:
        return []
    seen: list[dict[str, Any]] = []  # per call: module name -> its rows' fingerprint
    order: list[str] = []
    names = {module: name or "(model)" for name, module in model.named_modules()}

    def hook(module: Any, _inputs: Any, output: Any) -> None:
        tensor = output[0] if isinstance(output, tuple | list) and output else output
        if isinstance(tensor, torch.Tensor) and tensor.dim() > 0 and tensor.is_floating_point():
            rows = tensor.detach()[:half].double().reshape(min(half, len(tensor)), -1)
            seen[-1][names[module]] = (tuple(tensor.shape), rows.sum(1).cpu(),
                                       rows.abs().sum(1).cpu())
            if len(seen) == 1:
                order.append(names[module])

    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd)]
    saved = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    generators = random.getstate(), np.random.get_state()
    handles = [m.register_forward_hook(hook) for m in names]
    was_training = model.training
    cuda = [device] if getattr(device, "type", "cpu") == "cuda" else []
    try:
        model.train()
        for module in dropouts:
            module.eval()
        with torch.random.fork_rng(devices=cuda), torch.no_grad():
            for chosen in (examples[:half], examples[: 2 * half]):
                seen.append({})
                torch.manual_seed(0)
                with autocast():
                    precise = not torch.is_autocast_enabled(getattr(device, "type", "cpu"))
                    task.loss(model, to_device(task.collate(list(chosen)), device))
    except Exception:  # a batch this size cannot go alone (a BatchNorm of one row): not told
        return []
    finally:
        for handle in handles:
            handle.remove()
        for buffer, value in saved:
            buffer.copy_(value)
        random.setstate(generators[0])
        np.random.set_state(generators[1])
        model.train(was_training)
    tolerance = 1e-4 if precise else 5e-2  # float32, else bfloat16/float16 kernels by size
    for name in order:
        if name not in seen[0] or name not in seen[1]:
            continue
        (alone_shape, alone, alone_scale), (within_shape, within, _) = seen[0][name], seen[1][name]
        if alone_shape[0] != half or within_shape[0] != 2 * half or (
                alone_shape[1:] != within_shape[1:]):
            continue
        if ((alone - within).abs() > tolerance * alone_scale + 1e-6).any():
            return [f"{name} ({type(_module_named(model, name)).__name__}, its output for an "
                    "example depends on the rest of its batch)"]
    return []


def _module_named(model: Any, name: str) -> Any:
    return model if name == "(model)" else model.get_submodule(name)


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
    replicated = sorted({int(lp.get("replicas", 1)) for lp in loops} - {1})
    shared = layers != ["?"] and all("(SyncBatchNorm)" in layer for layer in layers)
    reasons = []
    if accumulated:
        reasons.append(f"accumulation {', '.join(map(str, accumulated))} normalises each "
                       "microbatch by its own statistics, so an update is not one big batch's "
                       "gradient")
    if replicated and not shared:
        reasons.append(f"replicas {', '.join(map(str, replicated))} normalise each replica's "
                       "microbatch by its own statistics (SyncBatchNorm would share them)")
    if len(microbatches) > 1:
        reasons.append(f"variants with microbatch {', '.join(map(str, microbatches))} also "
                       "differ in their batch statistics, not only in the key they set")
    if not reasons:
        return None
    more = f" and {len(layers) - 2} more" if len(layers) > 2 else ""
    return (f"the model has batch-statistics layers ({', '.join(layers[:2])}{more}): "
            + "; ".join(reasons))


def relaunch_warning(layers: list[str], old: Mapping[str, Any],
                     new: Mapping[str, Any]) -> str | None:
    """What a relaunch that changes how an update is cut changes beyond its keys, for a model
    with batch-statistics layers (recorded when the campaign was planned)."""
    keys = ("microbatch", "accumulation", "replicas")
    before, after = (dict(c.get("loop") or {}) for c in (old, new))
    changed = [f"loop.{k} {before.get(k, 1)} -> {after.get(k, 1)}" for k in keys
               if before.get(k, 1) != after.get(k, 1)]
    was, now = ((c.get("validation") or {}).get("microbatch") for c in (old, new))
    if was != now:  # a layer without running statistics normalises validation batches too
        changed.append(f"validation.microbatch {was} -> {now}")
    if not layers or not changed:
        return None
    more = f" and {len(layers) - 2} more" if len(layers) > 2 else ""
    return (f"the model has batch-statistics layers ({', '.join(layers[:2])}{more}): the "
            f"relaunch's {', '.join(changed)} changes the statistics each example is normalised "
            "by, not only the key it sets")
