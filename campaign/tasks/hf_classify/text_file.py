"""Text classification examples from JSONL, CSV or Parquet files, checked row by row.

Each row has ``id`` (unique in its file), ``text`` (a non-empty string) and ``label``: the
class's name (a string), or its number in the model's ``id2label`` (an integer), then
optionally with ``class_name``, the data's own name for it, which the task checks against
the model's. ``group`` (the leakage unit) is optional. A malformed row is refused with its
file and row number (the line, in a JSONL or CSV file), never skipped: a data set that
silently loses examples changes the question the campaign answers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from campaign.tasks.causal_lm.pairs_file import DataError, json_lines
from campaign.tasks.causal_lm.pairs_file import data_paths as pair_paths

FORMATS = (".jsonl", ".csv", ".parquet")


def read_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, row) for every row of one file, in file order; ``where`` is ``file:line``."""
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise DataError(f"{path}: not a {', '.join(FORMATS)} file")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if suffix == ".jsonl":
        return _jsonl(path)
    import pandas as pd

    try:
        frame = (pd.read_csv(path, dtype={"id": str, "text": str, "class_name": str,
                                          "group": str}, keep_default_na=False)
                 if suffix == ".csv" else pd.read_parquet(path))
    except Exception as error:  # pandas' and pyarrow's parse errors have no common base
        raise DataError(f"{path}: cannot read ({type(error).__name__}: {error})") from None
    first = 2 if suffix == ".csv" else 1  # a CSV's line 1 is its header
    return [(f"{path}:{'' if suffix == '.csv' else 'row '}{first + i}", _plain(row))
            for i, row in enumerate(frame.to_dict("records"))]


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """numpy scalars as Python values (a Parquet int64 label is an int)."""
    return {k: v.item() if hasattr(v, "item") else v for k, v in row.items()}


def _jsonl(path: Path) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{path}:{number}", row) for number, row in json_lines(path, "id, text and label")]


def read_examples(path: Path) -> list[dict[str, Any]]:
    """Every example of one file: ``id``, ``text``, ``label`` (a name or a number as given),
    ``class_name`` and ``group`` where given, and ``where`` (file and row)."""
    examples: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for where, row in read_rows(path):
        identity, text, label = row.get("id"), row.get("text"), row.get("label")
        if isinstance(identity, int) and not isinstance(identity, bool):
            identity = str(identity)
        if not isinstance(identity, str) or not identity:
            raise DataError(f"{where}: 'id' must be a non-empty string")
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{where}: 'text' must be a non-empty string")
        if isinstance(label, float) and not math.isnan(label) and label.is_integer():
            label = int(label)  # a CSV column of numbers
        if isinstance(label, str) and label.strip().lstrip("-").isdigit():
            label = int(label)
        if isinstance(label, bool) or not (isinstance(label, int) or
                                           (isinstance(label, str) and label)):
            raise DataError(f"{where}: 'label' must be a class name or its number, got "
                            f"{label!r}")
        if identity in seen:
            raise DataError(f"{where}: id {identity!r} already at {seen[identity]}")
        seen[identity] = where
        example = {"id": identity, "text": text, "label": label, "where": where}
        for optional in ("class_name", "group"):
            value = row.get(optional)
            if isinstance(value, str) and value:
                example[optional] = value
        examples.append(example)
    if not examples:
        raise DataError(f"{path}: no examples")
    return examples


def data_paths(options: dict[str, Any]) -> dict[str, Path]:
    """``task.data``'s split -> file (JSONL, CSV or Parquet)."""
    return pair_paths(options, "file", 'val = "data/val.csv"')
