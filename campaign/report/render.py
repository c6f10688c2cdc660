"""Exports of a balance sheet: HTML, Markdown, CSV, Parquet, JSON.

- HTML: one self-contained file (CSS inline, figures embedded as data: URIs,
  no script, no network fetch), printable; the conclusion and the integrity
  flags first; every string from the ledger goes through Jinja2's
  autoescape, so a variant named ``<script>`` is text. The run table fits
  1,400 px: the long fields sit in an expandable row.
- Markdown: see :mod:`campaign.report.markdown`.
- CSV and Parquet: the run table, one line per run.
- JSON: everything (the contract names of docs/report.md).
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from campaign.ledger.canonical import strict_json
from campaign.report.atomic import write_atomically
from campaign.report.balance import BalanceSheet
from campaign.report.humane import cell, label, missing
from campaign.report.inputs import CampaignInputs
from campaign.report.markdown import markdown, variants_heading
from campaign.report.template import TEMPLATE

# The run table's visible columns; every other field is in the row's details.
RUN_SUMMARY = ("run", "variant", "seed", "status", "stop", "updates", "final_metric",
               "best_metric", "training", "overhead", "peak", "flags")
RUN_DETAILS = ("run_id", "stop_detail", "stop_phase", "examples_seen", "final_metric_step",
               "best_metric_step", "wall_time_s", "data_wait_s", "input_bound", "projected_s",
               "peak_allocated_bytes", "peak_rss_bytes", "relaunch_of", "relaunch_reason",
               "lineage", "deviation")


def write(sheet: BalanceSheet, output_format: str, path: Path,
          inputs: CampaignInputs | None = None) -> Path:
    """Write ``sheet`` as ``output_format`` to ``path`` (atomically: a temporary file renamed)."""
    def written(temporary: Path) -> None:
        if output_format == "parquet":
            _flat(sheet.runs).to_parquet(temporary, index=False)
        else:
            temporary.write_text(render(sheet, output_format), encoding="utf-8")

    return write_atomically(path, written, inputs)


def render(sheet: BalanceSheet, output_format: str) -> str:
    if output_format == "html":
        return html(sheet)
    if output_format == "md":
        return markdown(sheet)
    if output_format == "csv":
        return _flat(sheet.runs).to_csv(index=False)
    if output_format == "json":
        return strict_json(document(sheet), indent=2, default=str)
    raise ValueError(f"unknown report format {output_format!r}")


def _flat(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.astype({"is_control": bool, "original": bool})


def html(sheet: BalanceSheet) -> str:
    from campaign.report import plots  # matplotlib: ~0.8 s to import, only when drawing

    charts = []
    for key in ("train/loss", sheet.metric):
        png = plots.metric_chart(sheet, key)
        why = None if png else no_curve_reason(sheet, key)
        charts.append({"key": key, "png": _b64(png), "why": why})
    memory, memory_why = plots.phase_memory(sheet)
    template = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    return template.from_string(TEMPLATE).render(
        **sheet_context(sheet), generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        charts=charts, memory=_b64(memory), memory_why=memory_why,
        search=search_context(sheet),
    )


def search_context(sheet: BalanceSheet, chart: bool = True) -> dict[str, Any] | None:
    """A search's section for people (campaign/report/search_section.py holds the numbers);
    ``chart``: with the space drawn (the HTML report; the dashboard shows the tables)."""
    from campaign.report.search_section import search_frames, search_words

    search = sheet.search
    if search is None:
        return None
    png = None
    if chart:
        from campaign.report.search_plots import space_chart

        png = space_chart(search, sheet.metric)
    summary, audit = search_words(search)
    return {"summary": summary, "audit": audit, "chart": _b64(png),
            **{name: table_rows(frame) for name, frame in search_frames(search).items()}}


def sheet_context(sheet: BalanceSheet) -> dict[str, Any]:
    """The balance sheet's tables formatted for people, as the HTML report and the dashboard
    show them (cells are plain strings: the templates escape them)."""
    return dict(
        sheet=sheet, campaign=sheet.campaign,
        flag_counts=sheet.flags["kind"].value_counts().to_dict() if len(sheet.flags) else {},
        conclusions=table_rows(sheet.conclusions), flags=table_rows(sheet.flags),
        variants=table_rows(sheet.variants), deltas=table_rows(sheet.deltas),
        relaunches=table_rows(sheet.relaunches.drop(columns=["relaunch_of", "original"])),
        runs=run_rows(sheet),
        summary_columns=RUN_SUMMARY, phases=table_rows(sheet.phases.dropna(axis=1, how="all")),
        notes=table_rows(sheet.notes), variants_heading=variants_heading(sheet),
    )


def _b64(png: bytes | None) -> str | None:
    return base64.b64encode(png).decode() if png else None


def no_curve_reason(sheet: BalanceSheet, key: str) -> str:
    if sheet.runs["status"].isin(("planned", "withdrawn")).all():
        return "no run has started yet: `campaign launch` executes the planned runs"
    if key == sheet.metric:
        return (f"no run reached its first validation point yet ({key} is logged every "
                "validation.every updates)")
    return f"no run logged {key}"


def table_rows(frame: pd.DataFrame) -> dict[str, Any]:
    """Columns and rows of ``frame`` with every cell formatted for people."""
    columns = list(frame.columns)
    rows = [[cell(c, v) for c, v in zip(columns, values, strict=True)]
            for values in frame.itertuples(index=False)]
    return {"columns": [label(c) for c in columns], "rows": rows}


def run_rows(sheet: BalanceSheet) -> list[dict[str, Any]]:
    rows = []
    for run in sheet.runs.to_dict("records"):
        stop = "" if missing(run["stop_cause"]) else str(run["stop_cause"])
        if stop and not pd.isna(run["stop_step"]):
            stop += f" @ {run['stop_step']}"
        peak = run["peak_allocated_bytes"]
        peak = run["peak_rss_bytes"] if pd.isna(peak) else peak
        summary = {
            "run": run["run_id"][-8:], "variant": run["variant"]
            + (" (control)" if run["is_control"] else "") + ("" if run["original"] else " ↻"),
            "seed": cell("seed", run["seed"]), "status": run["status"], "stop": stop,
            "updates": f"{run['updates_done']}/{run['updates_planned']}",
            "final_metric": cell("final_metric", run["final_metric"]),
            "best_metric": cell("best_metric", run["best_metric"]),
            "training": cell("training_s", run["training_s"]),
            "overhead": cell("overhead_s", run["overhead_s"]),
            "peak": cell("peak_bytes", peak), "flags": cell("flags", run["flags"]),
        }
        details = {label(c): cell(c, run[c]) for c in RUN_DETAILS if cell(c, run[c])}
        rows.append({"run_id": run["run_id"], "status": run["status"], "cells": summary,
                     "details": details})
    return rows


def document(sheet: BalanceSheet) -> dict[str, Any]:
    """Everything, as one JSON-able document (NaN as null; contract names, docs/report.md)."""

    def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
        return json.loads(frame.to_json(orient="records", date_format="iso",
                                        double_precision=15))

    return {
        "campaign": {k: str(v) if isinstance(v, datetime) else v
                     for k, v in sheet.campaign.items()},
        "metric": sheet.metric, "mode": sheet.mode, "conclusion": sheet.conclusion,
        **{name: records(frame) for name, frame in sheet.frames().items()},
        **({"search": sheet.search} if sheet.search is not None else {}),
    }
