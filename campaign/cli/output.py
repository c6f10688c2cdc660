"""Listings on the command line: ``--format table|json|csv`` (docs/cli.md).

``json`` prints one JSON document on stdout and nothing else there; messages
always go to stderr.
"""

from __future__ import annotations

import csv
import functools
import io
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import click

FORMATS = ("table", "json", "csv")
_F = TypeVar("_F", bound=Callable[..., Any])


def output_options(command: _F) -> _F:
    """Add ``--format`` to a listing command."""
    return click.option(
        "--format",
        "output_format",
        type=click.Choice(FORMATS),
        default="table",
        show_default=True,
        help="table for people, json (one document) or csv for scripts.",
    )(command)


def render_rows(
    rows: Sequence[Mapping[str, Any]],
    output_format: str,
    document: Any = None,
    columns: Sequence[str] = (),
) -> str:
    """Rows as an aligned table, CSV, or JSON (``document`` overrides the JSON body);
    ``columns`` names the CSV header when there may be no row (a script still reads one)."""
    if output_format == "json":
        return json.dumps(rows if document is None else document, indent=2, default=str)
    if output_format == "csv":
        return _csv(rows, columns)
    return _table(rows)


def _csv(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    buffer = io.StringIO()
    names = list(rows[0]) if rows else list(columns)
    if names:
        writer = csv.DictWriter(buffer, fieldnames=names, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: printable(v) if isinstance(v, str) else v for k, v in row.items()}
                         for row in rows)
    return buffer.getvalue().rstrip("\n")


def _table(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "(none)"
    columns = list(rows[0])
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    line = functools.partial(_line, widths=widths)
    return "\n".join([line(columns), line(["-" * w for w in widths]), *map(line, cells)])


def _line(values: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()


def _cell(value: Any) -> str:
    return "" if value is None else printable(str(value))


def printable(text: str) -> str:
    """``text`` safe for a terminal: control characters (ANSI escapes, carriage returns, the
    terminal-title sequence), line and paragraph separators and bidirectional overrides
    shown as escapes (``\\x1b``, ``\\u202e``), never acted on."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)
