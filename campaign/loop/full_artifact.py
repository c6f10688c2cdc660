"""The final artifact of a sharded run: the full, unsharded model, written by rank 0 one tensor
at a time.

What ``replay``, ``export`` and ``reproduce`` read is the same file a one-process run writes
(safetensors, the same metadata). A sharded model never exists whole on one rank, and must
not have to: the safetensors header (names, dtypes, full shapes, offsets) is known from the
sharded state alone, so rank 0 writes it first and then appends each tensor's bytes as the
ranks gather it (``full_tensor``, every rank in the same order), dropping it before the next.
safetensors' own writers take a dict of every tensor at once, hence this writer of its
documented format (an 8-byte little-endian header length, the JSON header padded to 8 bytes,
the data in header order).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from campaign.loop.checkpoint_file import ALIASES_KEY
from campaign.loop.model_state import saved_state
from campaign.loop.replicas import Replica
from campaign.loop.sharding import full

SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}


def write_gathered(path: Path, model: torch.nn.Module, task: Any, metadata: Mapping[str, str],
                   replica: Replica) -> None:
    """Every rank calls this; rank 0 writes ``path`` atomically (``metadata`` as safetensors
    string metadata, tied tensors stored once as the one-process artifact stores them)."""
    state = saved_state(model, task)
    kept: dict[tuple[int, ...], str] = {}
    aliases: dict[str, str] = {}
    for name in sorted(state):  # tied tensors: the same local storage (as stored_once finds)
        local = state[name].to_local() if hasattr(state[name], "to_local") else state[name]
        identity = (local.untyped_storage().data_ptr(), local.storage_offset(),
                    tuple(state[name].shape)) if local.numel() else (id(state[name]),)
        if identity in kept:
            aliases[name] = kept[identity]
        else:
            kept[identity] = name
    names = [n for n in sorted(state) if n not in aliases]
    header: dict[str, Any] = {"__metadata__": {**metadata, ALIASES_KEY: json.dumps(aliases)}}
    offset = 0
    for name in names:
        tensor = state[name]
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    temporary = path.with_suffix(".partial")
    handle = None
    if replica.leader:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(temporary, "wb")  # noqa: SIM115 (closed below, on every rank's path)
    try:
        if handle is not None:
            handle.write(struct.pack("<Q", len(encoded)) + encoded)
        for name in names:
            whole = full(state[name].detach())  # a gather: every rank, the same order
            if handle is not None:
                handle.write(whole.contiguous().cpu().reshape(-1).view(torch.uint8)
                             .numpy().tobytes())
            del whole
        if handle is not None:
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        if handle is not None:
            handle.close()
            temporary.unlink(missing_ok=True)
        raise
    if handle is not None:
        handle.close()
        os.replace(temporary, path)
