"""A data check's verdict (the data gate and the label gate share it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    """One check's verdict; ``warning`` marks a pass that proves less than it could (a check
    with nothing to look at), said so that nobody reads it as evidence."""

    check: str
    ok: bool
    detail: str
    advice: str = ""
    warning: bool = False
