"""Checkpoints of a sharded run: each rank's shards in a safetensors file of its own, indexed in
the JSON document of rank 0's file (docs/runs.md, "Sharded runs").

Rank r > 0 writes ``step-N.rank-r.safetensors`` (its local shard of every sharded tensor)
atomically as any checkpoint; rank 0 then writes ``step-N.safetensors``: its own shards, every
unsharded tensor (RNG states, step counters), the run's state and the index: the world size,
each sharded tensor's full shape and each rank file's name and SHA-256. The ledger records
rank 0's file, whose hash covers the index and so every shard's hash: a missing or damaged
shard fails the check of the whole checkpoint and a resume falls back to the previous one.

Loading reshards: a tensor sharded along its first dimension over W ranks (``torch.chunk``'s
split, FSDP2's) is read for any other (rank, world) by slicing only the rows that rank now
holds out of the files that hold them (safetensors reads slices without the rest), so a
resume on the same W reads back exactly its own shard and one on another W never holds more
than its share.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from campaign.errors import CheckpointError
from campaign.loop import checkpoint as ckpt
from campaign.loop import replicas as dp
from campaign.loop.checkpoint_file import (
    ALIASES_KEY,
    SHARDS_KEY,
    STATE_KEY,
    file_sha256,
    rank_file_name,
)
from campaign.loop.sharding import is_sharded


def localise(tensors: dict[str, torch.Tensor]) -> dict[str, list[int]]:
    """Replace every sharded tensor of ``tensors`` by this rank's shard; their full shapes."""
    shapes: dict[str, list[int]] = {}
    for key, tensor in list(tensors.items()):
        if is_sharded(tensor):
            shapes[key] = list(tensor.shape)
            tensors[key] = tensor.to_local()  # type: ignore[attr-defined]
    return shapes


def save(path: Path, tensors: dict[str, torch.Tensor], state: dict[str, Any],
         replica: dp.Replica, device: torch.device) -> ckpt.SavedCheckpoint | None:
    """Every rank's part of one checkpoint (``state["sharded"]``: the full shapes
    :func:`localise` gave); rank 0's file, with the index, is returned there, None on the other
    ranks. Every rank must call it (the index is gathered). An unsharded state is one file."""
    shapes = state.pop("sharded", None)
    if shapes is None:
        return ckpt.save(path, tensors, state) if replica.leader else None
    mine: dict[str, Any] | None = None
    if not replica.leader:
        own = {key: tensors[key] for key in shapes}
        written = ckpt.save(path.with_name(rank_file_name(path.name, replica.rank)), own,
                            {"step": state["step"], "rank": replica.rank,
                             "world": replica.world, "shard_of": path.name})
        mine = {"rank": replica.rank, "name": written.path.name, "sha256": written.sha256}
    files = dp.gather_json(mine, replica, device)
    if not replica.leader:
        return None
    index = {"world": replica.world, "shapes": dict(shapes),
             "files": [f for f in files or [] if f is not None]}
    return ckpt.save(path, tensors, {**state, SHARDS_KEY: index})


def load(path: Path, expected_sha256: str | None,
         replica: dp.Replica) -> tuple[Mapping[str, torch.Tensor], dict[str, Any]]:
    """A checkpoint's tensors as this (rank, world) holds them: a sharded tensor as this rank's
    share of it (all of it in one process), every other tensor whole. The shard files are
    checked against the index first."""
    tensors, state = ckpt.load(path, expected_sha256)
    index = state.pop(SHARDS_KEY, None)
    if index is None:
        return tensors, state
    files = {0: path}
    for entry in index["files"]:
        shard = path.with_name(entry["name"])
        if not shard.is_file():
            raise CheckpointError(f"checkpoint {path}: its rank {entry['rank']} shard {shard} "
                                  "is missing")
        if file_sha256(shard) != entry["sha256"]:
            raise CheckpointError(f"checkpoint {path}: its rank {entry['rank']} shard {shard} "
                                  "does not match the index (damaged): refused")
        files[int(entry["rank"])] = shard
    if sorted(files) != list(range(int(index["world"]))):
        raise CheckpointError(f"checkpoint {path}: its index lists ranks {sorted(files)} of "
                              f"{index['world']}")
    state["resharded_from"] = int(index["world"])
    return Resharded(tensors, files, index["shapes"], replica), state


class Resharded(Mapping[str, torch.Tensor]):
    """Rank 0's tensors, with every sharded one read as this rank's share, on access."""

    def __init__(self, leader: Mapping[str, torch.Tensor], files: Mapping[int, Path],
                 shapes: Mapping[str, list[int]], replica: dp.Replica) -> None:
        self.leader, self.files, self.shapes, self.replica = leader, files, shapes, replica

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self.shapes:
            return self.leader[key]
        rows = self.shapes[key][0] if self.shapes[key] else 1
        start, stop = chunk_rows(rows, self.replica.rank, self.replica.world)
        old = len(self.files)
        parts = []
        for rank in range(old):
            first, last = chunk_rows(rows, rank, old)
            low, high = max(start, first), min(stop, last)
            if low < high:
                parts.append(self._rows(rank, key, low - first, high - first))
        if not parts:  # this rank holds no row of it (fewer rows than ranks)
            return self.leader[key][0:0].clone()
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def _rows(self, rank: int, key: str, low: int, high: int) -> torch.Tensor:
        if rank == 0:
            return self.leader[key][low:high].clone()
        try:
            with safe_open(str(self.files[rank]), framework="pt") as handle:
                # a tied tensor's shard is stored once there, its other names aliases of it
                aliases = json.loads((handle.metadata() or {}).get(STATE_KEY, "{}")).get(
                    ALIASES_KEY, {})
                return handle.get_slice(aliases.get(key, key))[low:high]
        except (SafetensorError, OSError) as error:
            raise CheckpointError(f"shard {self.files[rank]}: {key} unreadable ({error})"
                                  ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.leader)

    def __len__(self) -> int:
        return len(self.leader)


def chunk_rows(rows: int, rank: int, world: int) -> tuple[int, int]:
    """The rows [start, stop) rank ``rank`` of ``world`` holds (``torch.chunk``'s split, as
    FSDP2 shards: ceil(rows / world) each, the last ranks short or empty)."""
    size = math.ceil(rows / world) if rows else 0
    start = min(rank * size, rows)
    return start, min(start + size, rows)


def to_layout(value: torch.Tensor, template: torch.Tensor) -> torch.Tensor:
    """``value`` (whole, or this rank's share already) laid out as ``template`` is: a DTensor
    over the same mesh for a sharded parameter, the tensor itself otherwise."""
    if not is_sharded(template):
        return value
    from torch.distributed.tensor import DTensor

    local = template.to_local()  # type: ignore[attr-defined]
    if tuple(value.shape) == tuple(template.shape) and value.shape != local.shape:
        start, stop = chunk_rows(value.shape[0], template.device_mesh.get_local_rank(),  # type: ignore[attr-defined]
                                 template.device_mesh.size())  # type: ignore[attr-defined]
        value = value[start:stop].clone()
    if tuple(value.shape) != tuple(local.shape):
        raise CheckpointError(f"a saved tensor of shape {list(value.shape)} does not fit the "
                              f"model's {list(template.shape)} (this rank holds "
                              f"{list(local.shape)})")
    return DTensor.from_local(value.to(local.device), template.device_mesh,  # type: ignore[attr-defined]
                              template.placements, run_check=False,  # type: ignore[attr-defined]
                              shape=template.shape, stride=template.stride())


def model_layout(state: Mapping[str, torch.Tensor],
                 model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A model state dict laid out as ``model``'s own (sharded or not)."""
    own = model.state_dict()
    return {key: to_layout(value, own[key]) if key in own else value
            for key, value in state.items()}


def optimizer_layout(document: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """An optimizer state dict with each parameter's state laid out as the parameter is."""
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    state = {
        index: {name: to_layout(value, parameters[int(index)])
                if isinstance(value, torch.Tensor) and value.ndim >= 1 else value
                for name, value in entry.items()}
        for index, entry in document["state"].items()
    }
    return {**document, "state": state}
