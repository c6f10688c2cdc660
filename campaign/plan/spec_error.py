"""The error of a spec that cannot be planned (its own module: the spec's checks and the
optimizer's check, which asks torch through the task host, both raise it)."""

from __future__ import annotations


class SpecError(ValueError):
    """A spec that cannot be planned; the message is the one line the user sees."""
