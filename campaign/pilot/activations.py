"""What a forward pass keeps for backward, measured exactly on any device.

Activation memory is what a larger model, a longer sequence or a bigger
microbatch multiplies; a peak of the process's memory mixes it with weights,
allocator caches and the interpreter. ``torch.autograd.graph.saved_tensors_hooks``
sees every tensor autograd saves: their storages, each counted once, are the
forward's activation bytes. Those saved while a module of the model's block
list runs (the largest ``ModuleList``: a transformer's layers) are told
apart, so a projection can scale the per-layer part with depth and width and
the rest (embeddings, final norm, logits) with its own sizes. The pilot's
forward phase records both, per position of the measured microbatch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from campaign.loop.sharding import block_list


@contextmanager
def saved_activations(model: torch.nn.Module) -> Iterator[dict[str, int]]:
    """Within the block: ``found["saved_bytes"]`` and ``found["saved_in_blocks_bytes"]`` grow
    with every tensor autograd saves (each storage counted once)."""
    found = {"saved_bytes": 0, "saved_in_blocks_bytes": 0, "blocks": 0}
    # weights (and views of them, a transposed matrix) are saved too: not activations
    seen: set[tuple[str, int]] = {(str(t.device), t.untyped_storage().data_ptr())
                                  for t in [*model.parameters(), *model.buffers()]}
    depth = [0]
    blocks = block_list(model)
    handles = []
    if blocks is not None:
        found["blocks"] = len(blocks)
        for block in blocks:
            handles.append(block.register_forward_pre_hook(lambda *_: _enter(depth)))
            handles.append(block.register_forward_hook(lambda *_: _leave(depth)))

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        if key not in seen:
            seen.add(key)
            found["saved_bytes"] += storage.nbytes()
            if depth[0]:
                found["saved_in_blocks_bytes"] += storage.nbytes()
        return tensor

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
            yield found
    finally:
        for handle in handles:
            handle.remove()


def positions(batch: Any) -> int:
    """The positions a microbatch computes: a token grid's size, else its examples."""
    if isinstance(batch, dict):
        tokens = batch.get("tokens", batch.get("input_ids"))
        if isinstance(tokens, torch.Tensor):
            return int(tokens.numel())
        for value in batch.values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                return int(value.shape[0])
    return 1


def measure(model: torch.nn.Module, batch: Any, forward: Callable[[], Any]) -> dict[str, int]:
    """Run ``forward`` once under the hooks; the figures the pilot records."""
    with saved_activations(model) as found:
        result = forward()
    del result  # the graph goes with it
    vocabulary = getattr(getattr(model, "config", None), "vocab_size", None)  # a language model
    return {**found, "positions": positions(batch),
            **({"vocab_size": int(vocabulary)} if isinstance(vocabulary, int) else {})}


def _enter(depth: list[int]) -> None:
    depth[0] += 1


def _leave(depth: list[int]) -> None:
    depth[0] -= 1


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor
