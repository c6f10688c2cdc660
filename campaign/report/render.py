"""Exports of a balance sheet: HTML, Markdown, CSV, Parquet, JSON.

- HTML: one self-contained file (CSS inline, figures embedded as data: URIs,
  no script, no network fetch), printable; every string from the ledger goes
  through Jinja2's autoescape, so a variant named ``<script>`` is text.
- Markdown: GitHub-flavoured tables (pipes and angle brackets in user text
  escaped), figures left out (a forge would not show embedded images).
- CSV and Parquet: the run table, one line per run.
- JSON: everything (campaign, run table, variants, deltas, pilot phases, notes).
"""

from __future__ import annotations

import base64
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from campaign.report.balance import BalanceSheet

_TEMPLATE = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string(
    """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<title>{{ campaign.name }} — balance sheet</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em; color: #111; }
table { border-collapse: collapse; margin: 0.6em 0 1.6em; font-size: 12px; }
th, td { border: 1px solid #bbb; padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #eee; }
tr.diverged td, tr.failed td, tr.oom td { background: #fdecea; }
tr.interrupted td, tr.lost td, tr.stopped td { background: #fff6e0; }
img { max-width: 100%; }
.meta { color: #555; }
@media print { body { margin: 0.5cm; } img { page-break-inside: avoid; } }
</style></head><body>
<h1>{{ campaign.name }}</h1>
<p>{{ campaign.question }}</p>
<p class="meta">task {{ campaign.task }} · spec sha256 {{ campaign.spec_sha256 }} ·
metric {{ metric }} ({{ mode }}) · generated {{ generated }}</p>
<h2>Variants</h2>
{{ variants }}
<h2>Deltas against the control, seed by seed</h2>
{{ deltas }}
<h2>Every run</h2>
{{ runs }}
{% if curves %}<h2>Curves</h2>
<img alt="loss and {{ metric }} curves of every run"
     src="data:image/png;base64,{{ curves }}">{% endif %}
<h2>Pilot: phases</h2>
{{ phases }}
{% if memory %}<img alt="peak memory per pilot phase"
     src="data:image/png;base64,{{ memory }}">{% endif %}
<h2>Notes</h2>
{{ notes }}
</body></html>
"""
)


def write(sheet: BalanceSheet, output_format: str, path: Path) -> Path:
    """Write ``sheet`` as ``output_format`` to ``path`` (atomically: a temporary file renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.partial")
    if output_format == "parquet":
        sheet.runs.to_parquet(temporary, index=False)
    else:
        temporary.write_text(render(sheet, output_format), encoding="utf-8")
    temporary.replace(path)
    return path


def render(sheet: BalanceSheet, output_format: str) -> str:
    if output_format == "html":
        return html(sheet)
    if output_format == "md":
        return markdown(sheet)
    if output_format == "csv":
        return sheet.runs.to_csv(index=False)
    if output_format == "json":
        return json.dumps(document(sheet), indent=2, default=str)
    raise ValueError(f"unknown report format {output_format!r}")


def html(sheet: BalanceSheet) -> str:
    def table(frame: pd.DataFrame) -> Any:
        if frame.empty:
            return jinja2.utils.markupsafe.Markup("<p>(none)</p>")
        classes = frame["status"].tolist() if "status" in frame else None
        return jinja2.utils.markupsafe.Markup(_html_table(frame, classes))

    from campaign.report import plots  # matplotlib: ~0.8 s to import, only when drawing

    curves, memory = plots.loss_curves(sheet), plots.phase_memory(sheet)
    return _TEMPLATE.render(
        campaign=sheet.campaign, metric=sheet.metric, mode=sheet.mode,
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        variants=table(sheet.variants), deltas=table(sheet.deltas), runs=table(sheet.runs),
        phases=table(sheet.phases), notes=table(sheet.notes),
        curves=base64.b64encode(curves).decode() if curves else None,
        memory=base64.b64encode(memory).decode() if memory else None,
    )  # fmt: skip


def _html_table(frame: pd.DataFrame, row_classes: list[str] | None) -> str:
    """A table with every cell escaped (pandas' to_html escapes too; this also escapes the
    row classes, which come from the status column)."""
    escape = jinja2.utils.markupsafe.escape
    head = "".join(f"<th>{escape(str(c))}</th>" for c in frame.columns)
    rows = []
    for index, row in enumerate(frame.itertuples(index=False)):
        css = f' class="{escape(row_classes[index])}"' if row_classes else ""
        cells = "".join(f"<td>{escape(_cell(v))}</td>" for v in row)
        rows.append(f"<tr{css}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def markdown(sheet: BalanceSheet) -> str:
    c = sheet.campaign
    parts = [
        f"# {_md(c['name'])}", "", _md(c["question"]), "",
        f"task `{c['task']}` · spec sha256 `{c['spec_sha256']}` · metric "
        f"`{sheet.metric}` ({sheet.mode})", "",
        "## Variants", "", _md_table(sheet.variants), "",
        "## Deltas against the control, seed by seed", "", _md_table(sheet.deltas), "",
        "## Every run", "", _md_table(sheet.runs), "",
        "## Pilot: phases", "", _md_table(sheet.phases), "",
        "## Notes", "", _md_table(sheet.notes), "",
    ]  # fmt: skip
    return "\n".join(parts)


def _md(text: Any) -> str:
    return (
        _cell(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")
        .replace(">", "&gt;").replace("\n", " ")
    )  # fmt: skip


def _md_table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "(none)"
    header = "| " + " | ".join(_md(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    lines = ["| " + " | ".join(_md(v) for v in row) + " |"
             for row in frame.itertuples(index=False)]  # fmt: skip
    return "\n".join([header, rule, *lines])


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def document(sheet: BalanceSheet) -> dict[str, Any]:
    """Everything, as one JSON-able document (NaN as null)."""

    def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
        return json.loads(frame.to_json(orient="records", date_format="iso"))

    return {
        "campaign": {k: str(v) if isinstance(v, datetime) else v
                     for k, v in sheet.campaign.items()},
        "metric": sheet.metric, "mode": sheet.mode,
        **{name: records(frame) for name, frame in sheet.frames().items()},
    }  # fmt: skip
