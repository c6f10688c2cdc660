"""Numbers as a reader wants them in HTML and Markdown: MiB/GiB, s/min/h, three significant
figures, "control" instead of True. JSON, CSV and Parquet keep the raw values (bytes,
seconds, full floats) for machines."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

BYTE_COLUMNS = frozenset({"allocated", "allocated_peak", "baseline_allocated", "reserved",
                          "reserved_peak", "rss", "rss_peak"})


def missing(value: Any) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, float) and math.isnan(value)


def size(value: float) -> str:
    """Bytes in binary units, three significant figures (489 MiB, 1.23 GiB)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{int(value)} B"


def duration(seconds: float) -> str:
    """Seconds as s, min or h with three significant figures."""
    if abs(seconds) >= 7200:
        return f"{seconds / 3600:.3g} h"
    if abs(seconds) >= 120:
        return f"{seconds / 60:.3g} min"
    return f"{seconds:.3g} s"


def number(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else ""
    if isinstance(value, float):
        return f"{value:.3g}" if math.isfinite(value) else str(value)
    return str(value)


SIGNED = frozenset({"mean_delta", "ci_low", "ci_high", "delta"})
SHARES = frozenset({"input_bound"})  # a fraction, shown as a percentage
PER_SEED = frozenset({"values", "missing"})


def label(column: str) -> str:
    """A column's heading for people: the unit suffix goes, the cells carry the unit
    (``peak_rss_bytes`` -> ``peak_rss``, ``training_s`` -> ``training``)."""
    for suffix in ("_bytes", "_s"):
        if column.endswith(suffix):
            return column[: -len(suffix)]
    return column


def cell(column: str, value: Any) -> str:
    """One table cell of ``column`` for people."""
    if isinstance(value, Mapping):
        seed = "seed " if column in PER_SEED else ""
        return ", ".join(f"{seed}{k}: {_inner(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value))
    if missing(value):
        return ""
    if column == "is_control":
        return "control" if value else ""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if column in SHARES and math.isfinite(value):
            return f"{value:.0%}"
        if column in SIGNED and math.isfinite(value):
            return f"{value:+.3g}"
        if column.endswith("_bytes") or column in BYTE_COLUMNS:
            return size(float(value))
        if column.endswith("_s"):
            return duration(float(value))
    return number(value)


def _inner(value: Any) -> str:
    if isinstance(value, list | tuple) and len(value) == 2:
        return f"{_word(value[0])} -> {_word(value[1])}"
    return number(value)


def _word(value: Any) -> str:
    return repr(value) if isinstance(value, str) else number(value)
