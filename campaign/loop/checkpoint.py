"""Checkpoints: one safetensors file, tensors plus a JSON document of everything else.

Why one file: it is written to a temporary name, flushed to disk and renamed
over nothing (``os.replace`` of a new name), so a crash mid-write leaves
either no new checkpoint or a complete one, never a torn file that looks
valid. The SHA-256 of the file is recorded in the ledger; loading verifies it
and parses the file with safetensors, which cannot run code: nothing is ever
unpickled.

What is in it: model, optimizer and scheduler state, the GradScaler, the
update counter, examples seen, every RNG state (python, numpy, torch, CUDA),
the data-order position and any metric points not yet flushed.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from campaign.errors import CheckpointError
from campaign.loop.checkpoint_file import (
    ALIASES_KEY,
    FORMAT_VERSION,
    STATE_KEY,
    file_sha256,
    rank_file_name,
)

__all__ = ["ALIASES_KEY", "FORMAT_VERSION", "STATE_KEY", "CheckpointError", "file_sha256"]


@dataclass(frozen=True)
class SavedCheckpoint:
    path: Path
    sha256: str
    size: int
    step: int


def save(path: Path, tensors: dict[str, torch.Tensor], state: Mapping[str, Any]) -> SavedCheckpoint:
    """Write atomically: temp file in the same directory, fsync, rename, fsync the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for leftover in path.parent.glob(".*.partial"):  # a killed writer's: never a checkpoint
        # only this rank's kind of file: another node's rank writes beside it, its PID not ours
        if _rank_of(leftover.name) == _rank_of(path.name) and not _writer_alive(leftover):
            leftover.unlink(missing_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.partial")
    unique, aliases = stored_once(tensors)
    document = json.dumps({"format": FORMAT_VERSION, **state, ALIASES_KEY: aliases},
                          allow_nan=True)
    try:
        save_file(unique, str(temporary), metadata={STATE_KEY: document})
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:  # a full volume, a signal: no torn file left to take space
        temporary.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return SavedCheckpoint(path, file_sha256(path), path.stat().st_size, int(state["step"]))


def _rank_of(name: str) -> int:
    """The rank whose file ``name`` is (``step-N.rank-R.safetensors``; rank 0's have none)."""
    found = re.search(r"\.rank-(\d+)\.", name)
    return int(found.group(1)) if found else 0


def _writer_alive(partial: Path) -> bool:
    """A ``.NAME.PID.partial`` file whose writer still runs (a live segment's save)."""
    pid = partial.name.rsplit(".", 2)[-2]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return int(pid) != os.getpid()


def prune(folder: Path, keep_last: int, newest: Path) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoint files of ``newest``'s segment (by
    step; the file just written and verified always kept). Other segments' files are never
    touched (a stale worker must not prune its successor's). Their ledger rows stay, and a
    resume skips a pruned file for the newest one still there. Returns what was deleted."""
    segment = _step_and_segment(newest)[1]
    files = sorted((f for f in folder.glob("step-*.safetensors")
                    if _step_and_segment(f)[1] == segment), key=_step_and_segment)
    doomed = [f for f in files[: max(0, len(files) - keep_last)] if f != newest]
    for path in doomed:  # a sharded checkpoint's rank files go with it
        for shard in path.parent.glob(rank_file_name(path.name, 0).replace(".rank-0.", ".rank-*.")):
            shard.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
    return doomed


def _step_and_segment(path: Path) -> tuple[int, int]:
    match = re.fullmatch(r"step-(\d+)(?:-segment-(\d+))?\.safetensors", path.name)
    return (int(match.group(1)), int(match.group(2) or 1)) if match else (-1, 0)


def load(path: Path, expected_sha256: str | None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Verify the hash the ledger recorded, then parse as safetensors (never unpickle)."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    actual = file_sha256(path)
    if expected_sha256 is not None and actual != expected_sha256:
        raise CheckpointError(
            f"checkpoint {path} does not match the ledger (sha256 {actual[:12]}, "
            f"recorded {expected_sha256[:12]}): refused"
        )
    try:
        with safe_open(str(path), framework="pt") as handle:
            state = json.loads((handle.metadata() or {})[STATE_KEY])
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    except (SafetensorError, ValueError, KeyError, OSError) as error:
        raise CheckpointError(
            f"checkpoint {path} is not a readable campaign checkpoint ({error}): refused"
        ) from None
    if state.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has unknown format {state.get('format')!r}")
    try:
        tensors = with_aliases(tensors, state.pop(ALIASES_KEY, {}))
    except KeyError as error:
        raise CheckpointError(f"checkpoint {path}: alias of a missing tensor {error}") from None
    return tensors, state


def stored_once(
    tensors: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors for safetensors (contiguous, on the CPU) with each shared tensor stored once.

    A model with tied weights (an embedding shared with the output layer, as nanoGPT and
    many Hugging Face models have) has two state-dict entries for one tensor; safetensors
    refuses shared memory. The first name (sorted) keeps the data, the others become
    aliases (name -> kept name) that :func:`with_aliases` restores on load, where
    ``load_state_dict`` copies the same values into the tied parameter twice: the tie holds.
    Two entries that overlap without being the same tensor are stored as copies.
    """
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[Any, ...], str] = {}
    storages: set[tuple[str, int]] = set()
    for name in sorted(tensors):
        tensor = tensors[name].detach()
        storage = (str(tensor.device), tensor.untyped_storage().data_ptr())
        identity = (*storage, tensor.storage_offset(), tuple(tensor.shape), tensor.stride(),
                    tensor.dtype)
        if tensor.numel() and identity in seen:
            aliases[name] = seen[identity]
            continue
        stored = tensor.contiguous().cpu()
        if tensor.numel() and storage in storages:
            stored = stored.clone()  # another view of memory already stored: its own copy
        if tensor.numel():
            storages.add(storage)
            seen[identity] = name
        unique[name] = stored
    return unique, aliases


def with_aliases(
    tensors: dict[str, torch.Tensor], aliases: Mapping[str, str]
) -> dict[str, torch.Tensor]:
    """``tensors`` with every alias name pointing at the tensor it shares (see above)."""
    return {**tensors, **{alias: tensors[kept] for alias, kept in aliases.items()}}


# -- state dicts <-> (tensors, JSON) --------------------------------------------------------


def split_state(prefix: str, state: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Move every tensor of a nested state dict into ``tensors``; return the JSON rest."""
    if isinstance(state, torch.Tensor):
        tensors[prefix] = state
        return {"__tensor__": prefix}
    if isinstance(state, Mapping):
        return {
            "__keys__": [
                [_key(k), split_state(f"{prefix}.{k}", v, tensors)] for k, v in state.items()
            ]
        }
    if isinstance(state, list | tuple):
        kind = "__list__" if isinstance(state, list) else "__tuple__"
        return {kind: [split_state(f"{prefix}.{i}", v, tensors) for i, v in enumerate(state)]}
    return state


def join_state(document: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(document, dict):
        if "__tensor__" in document:
            return tensors[document["__tensor__"]]
        if "__keys__" in document:
            return {_unkey(k): join_state(v, tensors) for k, v in document["__keys__"]}
        if "__list__" in document:
            return [join_state(v, tensors) for v in document["__list__"]]
        if "__tuple__" in document:
            return tuple(join_state(v, tensors) for v in document["__tuple__"])
    return document


def _key(key: Any) -> Any:
    return {"int": key} if isinstance(key, int) else key


def _unkey(key: Any) -> Any:
    return key["int"] if isinstance(key, dict) else key


def rng_state(tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """All random generators the loop uses; torch and CUDA states as tensors."""
    tensors["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        for index, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{index}"] = state
    kind, keys, position, has_gauss, gauss = np.random.get_state()
    tensors["rng.numpy"] = torch.from_numpy(np.asarray(keys, dtype=np.int64))
    version, internal, gauss_next = random.getstate()
    return {
        "numpy": [kind, int(position), int(has_gauss), float(gauss)],
        "python": [version, list(internal), gauss_next],
        "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }


def restore_rng(document: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> None:
    torch.set_rng_state(tensors["rng.torch"])
    for index in range(int(document.get("cuda_devices", 0))):
        if torch.cuda.is_available() and index < torch.cuda.device_count():
            torch.cuda.set_rng_state(tensors[f"rng.cuda.{index}"], index)
    kind, position, has_gauss, gauss = document["numpy"]
    keys = tensors["rng.numpy"].numpy().astype(np.uint32)
    np.random.set_state((kind, keys, position, has_gauss, gauss))
    version, internal, gauss_next = document["python"]
    random.setstate((version, tuple(internal), gauss_next))
