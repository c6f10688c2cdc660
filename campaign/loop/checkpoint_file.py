"""What identifies a checkpoint file without loading it (no torch here): its SHA-256 and the
format of the JSON document in its safetensors metadata. The supervisor and the worker verify
a resume point with these before a run leaves ``interrupted``/``lost``."""

from __future__ import annotations

from campaign.stack.project import sha256_file as file_sha256

ALIASES_KEY = "shared_tensors"  # in the JSON document: alias name -> the name stored
STATE_KEY = "campaign_checkpoint"
FORMAT_VERSION = 1

__all__ = ["ALIASES_KEY", "FORMAT_VERSION", "STATE_KEY", "file_sha256"]
