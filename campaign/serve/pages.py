"""The dashboard's pages: what each one reads from the ledger and hands to its template.

Pages are rendered on the server from the same reads and formatted tables
as the HTML report (:func:`campaign.report.render.sheet_context`), through
Jinja2 with autoescape, so every ledger string is text. What changes while
runs train (the status, the curves) is then kept current by the page's
script through :mod:`campaign.serve.watch`; the page data it starts from is
embedded as a JSON block (``tojson`` escapes ``<``, ``>`` and ``&``).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import jinja2

from campaign.ledger import LedgerReader
from campaign.ledger.vocabulary import TERMINAL_STATUSES
from campaign.serve.watch import Watcher

DEFAULT_KEYS = ("train/loss",)


@cache
def environment() -> jinja2.Environment:
    folder = resources.files("campaign.serve") / "templates"
    templates = {entry.name: entry.read_text(encoding="utf-8") for entry in folder.iterdir()
                 if entry.name.endswith(".html")}
    return jinja2.Environment(loader=jinja2.DictLoader(templates), autoescape=True,
                              undefined=jinja2.StrictUndefined)


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


def campaigns_page(reader: LedgerReader) -> str:
    overview = reader.campaign_overview()
    return render("campaigns.html", campaigns=overview, ledger=reader.url,
                  page={"kind": "campaigns"})


def campaign_page(watcher: Watcher, name: str) -> str:
    """The campaign's balance sheet and, embedded, the live view it starts from (every point
    of train/loss and the validation metric): the page's first poll is then already done."""
    from campaign.report.balance import balance_sheet
    from campaign.report.render import search_context, sheet_context

    reader = watcher.reader
    sheets: list[Any] = []

    def curves() -> Any:
        sheets.append(balance_sheet(reader, name))
        return sheets[0].curves

    initial = watcher.first_view(name, curves)
    sheet = sheets[0]
    all_keys = reader.metric_keys(name)
    shown = list(dict.fromkeys([*DEFAULT_KEYS, sheet.metric]))
    runs = sheet.runs
    page = {
        "kind": "campaign", "campaign": name, "metric": sheet.metric, "mode": sheet.mode,
        "keys": shown, "all_keys": sorted(set(all_keys) | set(shown)),
        "variants": list(dict.fromkeys(runs["variant"])),
        "ended_at_load": int(runs["status"].isin(tuple(TERMINAL_STATUSES)).sum()),
        # a search counts its confirmation runs alone (docs/search.md), so do its means
        "confirm_seeds": sheet.search["confirm_seeds"] if sheet.search is not None else None,
        "initial": initial,
    }
    return render("campaign.html", **sheet_context(sheet), page=page, ledger=reader.url,
                  search=search_context(sheet, chart=False))


def run_page(reader: LedgerReader, run_id: str) -> str:
    from campaign.plan.config_keys import config_changes, flatten

    run = reader.run(run_id)
    config = run.config_document
    control = _control_run(reader, run)
    changes = {} if control is None or control.id == run.id else config_changes(
        control.config_document, config)
    rows = [{"key": key, "value": json.dumps(value), "differs": key in changes,
             "control": json.dumps(changes[key][0]) if key in changes else "(same)"}
            for key, value in flatten(config).items()]
    segments = reader.segments(run.campaign)
    events = reader.events(run.campaign, run.id)
    artifacts = reader.artifacts(run.campaign)
    page = {"kind": "run", "campaign": run.campaign, "run": run.id,
            "keys": reader.metric_keys(run.campaign, run.id)}
    return render(
        "run.html", run=run, page=page, ledger=reader.url, config=rows, control=control,
        changed=list(changes),
        segments=_records(segments[segments["run_id"] == run.id].drop(columns=["run_id"])),
        events=_records(events.drop(columns=["run_id", "id"])),
        artifacts=_records(artifacts[artifacts["run_id"] == run.id].drop(columns=["run_id"])),
    )


def _control_run(reader: LedgerReader, run: Any) -> Any:
    """The original control run of the same seed (else the first original control run)."""
    _, rows = reader.live_runs(run.campaign)
    controls = [r for r in rows if r["is_control"] and r["relaunch_of"] is None]
    same = [r for r in controls if r["seed"] == run.seed]
    chosen = (same or controls)[:1]
    return reader.run(chosen[0]["id"]) if chosen else None


def _records(frame: Any) -> dict[str, Any]:
    from campaign.report.humane import missing

    columns = list(frame.columns)
    rows = [["" if missing(v) else str(v) for v in values]
            for values in frame.itertuples(index=False)]
    return {"columns": columns, "rows": rows}
