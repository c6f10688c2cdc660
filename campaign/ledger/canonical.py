"""Canonical JSON and its SHA-256: the bytes that are stored are the bytes that are hashed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


def canonical_json(document: Mapping[str, Any] | list[Any]) -> str:
    """Serialise with sorted keys and no insignificant whitespace.

    ``allow_nan=False``: NaN and infinities are not JSON and would make two
    equal configs hash differently across tools.
    """
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
