"""What of a model is saved: all of it, or, for an adapter on a frozen base, only what trains.

A task whose base model is frozen and rebuilt the same way from its config
(LoRA on a pretrained folder or on a seeded config) sets ``trainable_only``:
checkpoints and the final artifact then hold only the trainable parameters
(megabytes, not the base's gigabytes), and the base is identified instead:
``base_identity()`` (what it is: a folder, a config, a tokenizer) plus the
SHA-256 of its frozen weights. Loading rebuilds the base with ``task.model()``,
checks its hash against the recorded one (a base folder that changed since
is refused, never silently combined with an adapter trained on another), and
loads the saved tensors into the trainable parameters, every one of them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import torch

from campaign.errors import CheckpointError


def trainable_only(task: Any) -> bool:
    return bool(getattr(task, "trainable_only", False))


def saved_state(model: torch.nn.Module, task: Any) -> dict[str, torch.Tensor]:
    """The model's state dict, or only its trainable parameters' entries."""
    state = model.state_dict()
    if not trainable_only(task):
        return state
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    return {name: tensor for name, tensor in state.items() if name in trainable}


def base_record(model: torch.nn.Module, task: Any) -> dict[str, Any] | None:
    """The frozen base's identity and hash (None when the whole model is saved)."""
    if not trainable_only(task):
        return None
    identity = getattr(task, "base_identity", None)
    facts = getattr(task, "adapter_facts", None)  # recorded, never compared on load
    return {**(facts() if callable(facts) else {}),
            **(identity() if callable(identity) else {}), "sha256": frozen_sha256(model)}


def as_text(base: Mapping[str, Any]) -> str:
    """The base record as the ``base_model`` event's detail (JSON, keys sorted)."""
    return json.dumps(base, sort_keys=True, default=str)


def load_saved_state(
    model: torch.nn.Module, state: Mapping[str, torch.Tensor], task: Any,
    base: Mapping[str, Any] | None, where: str,
) -> None:
    """The inverse of :func:`saved_state`, the base checked first (``where`` names the file)."""
    if not trainable_only(task):
        if base is not None:
            raise CheckpointError(f"{where} holds only an adapter, the task saves whole models")
        model.load_state_dict(state, strict=True)
        return
    if base is None:
        raise CheckpointError(f"{where} holds a whole model, the task saves adapters only")
    identity = getattr(task, "base_identity", None)
    current = identity() if callable(identity) else {}
    for key, value in current.items():  # a tokenizer or a config apart from the weights
        if json.loads(json.dumps(value, default=str)) != base.get(key):
            raise CheckpointError(f"{where}: its base's {key} was {base.get(key)!r}, the task "
                                  f"now builds {value!r}: refused")
    found = frozen_sha256(model)
    if found != base.get("sha256"):
        raise CheckpointError(
            f"{where}: the base model differs from the one it was trained on (frozen weights "
            f"{found[:12]}, recorded {str(base.get('sha256'))[:12]}; base {base.get('base')})")
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    if set(state) != trainable:
        extra, missing = sorted(set(state) - trainable), sorted(trainable - set(state))
        raise CheckpointError(f"{where}: its tensors are not the model's trainable parameters "
                              f"(missing {missing[:3]}, unexpected {extra[:3]})")
    model.load_state_dict(state, strict=False)


def frozen_sha256(model: torch.nn.Module) -> str:
    """SHA-256 over the frozen parameters (name, dtype, shape, bytes) in name order."""
    digest = hashlib.sha256()
    frozen = {n: p for n, p in model.named_parameters() if not p.requires_grad}
    for name in sorted(frozen):
        whole = frozen[name].detach()
        if hasattr(whole, "full_tensor"):  # a sharded run's: every rank gathers, name order
            whole = whole.full_tensor()
        tensor = whole.to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}|{tensor.dtype}|{list(frozen[name].shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
