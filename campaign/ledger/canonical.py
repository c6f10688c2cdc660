"""Canonical JSON and its SHA-256: the bytes that are stored are the bytes that are hashed."""

from __future__ import annotations

import hashlib
import json
import math
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


def strict_json(document: Any, **options: Any) -> str:
    """``document`` as JSON every parser reads: a NaN or an infinity (a diverged run's loss)
    is ``null``, where Python would write ``NaN`` or ``Infinity``, which are not JSON
    (docs/report.md: missing values, NaN and infinities are null)."""
    return json.dumps(_finite(document), allow_nan=False, **options)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
