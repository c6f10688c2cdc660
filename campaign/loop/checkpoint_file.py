"""What identifies a checkpoint file without loading it (no torch here): its SHA-256 and the
format of the JSON document in its safetensors metadata. The supervisor and the worker verify
a resume point with these before a run leaves ``interrupted``/``lost``."""

from __future__ import annotations

import hashlib
from pathlib import Path

ALIASES_KEY = "shared_tensors"  # in the JSON document: alias name -> the name stored
STATE_KEY = "campaign_checkpoint"
FORMAT_VERSION = 1


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

