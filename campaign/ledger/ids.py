"""Run identities: generated once, sortable by creation time, unguessable.

A run id is a ULID-style string: 48 bits of milliseconds since the epoch and
80 random bits from :mod:`secrets`, in Crockford base32 (26 characters, no
ambiguous letters). Sorting ids sorts runs by creation time; within one
millisecond of one process the random part is incremented, so a plan's runs
keep their order. The random part makes collisions between machines
negligible and ids impossible to guess; the primary key makes reuse
impossible even so.
"""

from __future__ import annotations

import secrets
import threading
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case
RUN_ID_LENGTH = 26
_RANDOM_BITS = 80
_lock = threading.Lock()
_last = (0, 0)


def new_run_id(now_ms: int | None = None) -> str:
    """Return a fresh run id; ``now_ms`` only exists to test the ordering."""
    global _last
    if now_ms is not None:
        return _encode((now_ms << _RANDOM_BITS) | secrets.randbits(_RANDOM_BITS))
    ms = int(time.time() * 1000)
    with _lock:
        last_ms, last_random = _last
        if ms <= last_ms and last_random + 1 < (1 << _RANDOM_BITS):
            ms, random_part = last_ms, last_random + 1
        else:
            random_part = secrets.randbits(_RANDOM_BITS)
        _last = (ms, random_part)
    return _encode((ms << _RANDOM_BITS) | random_part)


def _encode(value: int) -> str:
    chars = []
    for _ in range(RUN_ID_LENGTH):
        value, digit = divmod(value, 32)
        chars.append(_ALPHABET[digit])
    return "".join(reversed(chars))


def looks_like_run_id(text: str) -> bool:
    """Cheap syntactic check used to give a clear error before any query."""
    return len(text) == RUN_ID_LENGTH and all(c in _ALPHABET for c in text.lower())
