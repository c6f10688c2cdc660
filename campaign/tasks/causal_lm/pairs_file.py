"""Instruction -> response pairs from JSONL files, checked line by line.

Each line is one JSON object with ``id`` (unique in its file), ``group`` (the
leakage unit: examples of one group must stay in one split), ``prompt`` and
``response`` (non-empty strings). A malformed line is refused with its file
and line number, never skipped: a data set that silently loses examples
changes the question the campaign answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIELDS = ("id", "group", "prompt", "response")
SPLITS = ("train", "val")  # required; "test" is optional


class DataError(ValueError):
    """A data file that cannot be read as instruction pairs (the message names file and line)."""


def json_lines(path: Path, fields: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-empty line of a JSONL file; a DataError naming the
    file and line for one that is not a JSON object (``fields``: what one holds, in words)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise DataError(f"{path}: cannot read ({error.strerror or error})") from None
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error.reason})") from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{number}: not JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{number}: a JSON object with {fields} expected")
        rows.append((number, row))
    return rows


def read_pairs(path: Path) -> list[dict[str, Any]]:
    """Every example of one JSONL file, in file order."""
    examples: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for number, row in json_lines(path, ", ".join(FIELDS)):
        for field in FIELDS:
            value = row.get(field)
            if not isinstance(value, str) or not value:
                raise DataError(f"{path}:{number}: {field!r} must be a non-empty string")
        if row["id"] in seen:
            raise DataError(f"{path}:{number}: id {row['id']!r} already on line {seen[row['id']]}")
        seen[row["id"]] = number
        examples.append({field: row[field] for field in FIELDS})
    if not examples:
        raise DataError(f"{path}: no examples")
    return examples


def data_paths(options: dict[str, Any], files: str = "JSONL path",
               example: str = "val = \"data/val.jsonl\"") -> dict[str, Path]:
    """``task.data``'s split -> path (relative paths from the working folder); ``files`` and
    ``example`` word the error for the task's own kind of file."""
    data = options.get("data")
    if not isinstance(data, dict):
        raise DataError(f"task.data: a table of split -> {files} is required, e.g. "
                        f"{{ train = \"data/train.jsonl\", {example} }}")
    missing = [split for split in SPLITS if split not in data]
    if missing:
        raise DataError(f"task.data: no {' or '.join(missing)} file named")
    unknown = sorted(set(data) - {*SPLITS, "test"})
    if unknown:
        raise DataError(f"task.data.{unknown[0]}: not a split (train, val, test)")
    return {split: Path(str(path)).expanduser() for split, path in data.items()}
