"""What identifies a checkpoint file without loading it (no torch here): its SHA-256 and the
format of the JSON document in its safetensors metadata. The supervisor and the worker verify
a resume point with these before a run leaves ``interrupted``/``lost``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from campaign.stack.project import sha256_file as file_sha256

ALIASES_KEY = "shared_tensors"  # in the JSON document: alias name -> the name stored
STATE_KEY = "campaign_checkpoint"
SHARDS_KEY = "shards"  # a sharded run's index: world, full shapes, every rank file and hash
FORMAT_VERSION = 1

__all__ = ["ALIASES_KEY", "FORMAT_VERSION", "SHARDS_KEY", "STATE_KEY", "file_sha256"]


def rank_file_name(name: str, rank: int) -> str:
    """``step-N.safetensors`` -> ``step-N.rank-R.safetensors``: rank R's shards beside it."""
    return name.removesuffix(".safetensors") + f".rank-{rank}.safetensors"


def shard_problem(path: Path, state: Mapping[str, Any]) -> str | None:
    """Why the rank files a sharded checkpoint's index lists do not hold (None: they do, or
    the checkpoint is not sharded)."""
    index = state.get(SHARDS_KEY)
    if not index:
        return None
    for entry in index.get("files", []):
        shard = path.with_name(str(entry["name"]))
        if not shard.is_file():
            return f"its rank {entry['rank']} shard {shard.name} is missing"
        if file_sha256(shard) != entry["sha256"]:
            return f"its rank {entry['rank']} shard {shard.name} does not match the index"
    return None
