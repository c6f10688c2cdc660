"""``campaign show NAME_OR_RUN``: a campaign's header and variants, or one run's full config.

A run id shows the run's whole resolved config (every dotted key) and its
difference to the control run of the same seed, so a relaunch planned with a
mistake (a microbatch changed, its accumulation forgotten) is seen before it
spends anything.
"""

from __future__ import annotations

import json
from typing import Any

import click

from campaign.cli.output import output_options, printable, render_rows
from campaign.cli.source import LedgerSource
from campaign.ledger.canonical import strict_json
from campaign.ledger.vocabulary import RUN_STATUSES


@click.command()
@click.argument("target", metavar="CAMPAIGN_OR_RUN_ID")
@output_options
@click.pass_obj
def show(source: LedgerSource, target: str, output_format: str) -> None:
    """Show a campaign (question, frozen spec hash, variants, accounting, run counts) or one
    run (its full resolved config and its difference to the control run of its seed).

    Examples: campaign show digits-lr · campaign show 01jd8w... --format json
    """
    from campaign.errors import NotFound

    with source.open() as ledger:
        try:
            record = ledger.campaign(target)
        except NotFound as missing:
            try:
                run = ledger.run(target)
            except NotFound:
                raise NotFound(f"{missing} (nor is it a run id)") from None
            frame = ledger.runs(run.campaign)
            artifacts = ledger.artifacts(run.campaign)
            files = artifacts[artifacts["run_id"] == run.id]
            _show_run(run, frame, files, output_format)
            return
        frame = ledger.runs(target)
        note_count = len(ledger.notes(target))
    _show_campaign(record, frame, note_count, output_format)


def _show_run(run: Any, frame: Any, files: Any, output_format: str) -> None:
    from campaign.plan.config_keys import config_changes, flatten

    config = run.config_document
    controls = frame[frame["is_control"] & frame["relaunch_of"].isna()]
    same_seed = controls[controls["seed"] == run.seed]
    control = (same_seed if len(same_seed) else controls).head(1)
    control_id = control["run_id"].iloc[0] if len(control) else None
    changes = {} if control_id in (None, run.id) else config_changes(
        control["config"].iloc[0], config)
    header = {"run_id": run.id, "campaign": run.campaign, "variant": run.variant,
              "seed": run.seed, "status": run.status, "stop_cause": run.stop_cause,
              "stop_step": run.stop_step, "stop_detail": run.stop_detail,
              "relaunch_of": run.relaunch_of,
              "relaunch_reason": run.relaunch_reason, "config_sha256": run.config_sha256,
              "control_run": control_id}
    latest = files.sort_values("id").groupby("kind").tail(1)  # the newest file of each kind
    for kind in ("log", "traceback", "final", "checkpoint"):
        found = latest[latest["kind"] == kind]
        header[kind] = str(found["path"].iloc[0]) if len(found) else None
    if output_format == "json":
        document = {**header, "config": config, "changes_from_control": changes}
        click.echo(json.dumps(document, indent=2, default=str))
        return
    rows = [{"key": key, "value": json.dumps(value), "control": (
                json.dumps(changes[key][0]) if key in changes else "(same)")}
            for key, value in flatten(config).items()]
    if output_format == "table":
        for key, value in header.items():
            click.echo(f"{key + ':':<16} {'' if value is None else printable(str(value))}")
        click.echo("")
        different = ", ".join(changes) or "none"
        click.echo(f"differs from the control run in: {different}")
        click.echo("")
    click.echo(render_rows(rows, output_format))


def _show_campaign(record: Any, frame: Any, note_count: int, output_format: str) -> None:
    """Per variant, counted like the report: original runs by status (one per seed),
    relaunches apart; the budget columns are what each original run is planned to do."""
    spec = record.spec_document
    hold = spec.get("hold", {})
    originals = frame[frame["relaunch_of"].isna()]
    counts = originals.groupby(["variant", "status"]).size().unstack(fill_value=0)
    variants = []
    for name in dict.fromkeys(frame["variant"]):
        rows = frame[frame["variant"] == name]
        mine = originals[originals["variant"] == name]
        budget = (mine if len(mine) else rows).iloc[0]["config"]["budget"]
        epochs = budget.get("epochs")
        variants.append({
            "variant": name, "control": bool(rows.iloc[0]["is_control"]),
            "original_runs": len(mine), "relaunches": len(rows) - len(mine),
            **{status: int(counts.loc[name].get(status, 0)) for status in RUN_STATUSES
               if status in counts.columns and name in counts.index},
            "examples_per_update": budget.get("examples_per_update"),
            "updates_planned": budget.get("updates"),
            "examples_planned": budget.get("examples_seen"),
            "epochs_planned": None if epochs is None else round(float(epochs), 4),
        })
    header = {
        "campaign": record.name, "question": record.question, "task": record.task,
        "spec_sha256": record.spec_sha256, "created_at": record.created_at.isoformat(),
        "runs": len(frame), "notes": note_count,
    }
    if output_format == "json":
        click.echo(json.dumps({**header, "hold": hold, "variants": variants}, indent=2,
                              default=str))
        return
    if output_format == "table":
        held = ", ".join(f"{k}={v!r}" for k, v in sorted(hold.items()))
        for key, value in {**header, "hold": held}.items():
            click.echo(f"{key + ':':<13} {printable(str(value))}")
        click.echo("")
    shown = [{**v, "control": "yes" if v["control"] else ""} for v in variants]
    click.echo(render_rows(shown, output_format))


@click.command()
@click.argument("run_id")
@click.option("--key", "keys", multiple=True, metavar="KEY",
              help="A metric to show (repeat for several; default train/loss and the "
                   "campaign's validation metric).")
@output_options
@click.pass_obj
def curve(source: LedgerSource, run_id: str, keys: tuple[str, ...], output_format: str) -> None:
    """One run's curves, update by update: a column per metric (the latest segment's value
    where a resume replayed steps), with the examples seen.

    Example: campaign curve 01jd8x3m5k2q9w7c4v6b1n0r8t --key train/loss --key val/accuracy
    """
    from campaign.errors import BadInput

    with source.open() as ledger:
        record = ledger.run(run_id)
        spec = ledger.campaign(record.campaign).spec_document
        wanted = list(keys) or ["train/loss", (spec.get("validation") or {}).get("metric",
                                                                                 "val/loss")]
        points = ledger.metrics(runs=[run_id])
    known = sorted(set(points["key"]))
    if not known:
        raise BadInput(f"run {run_id} has recorded no metric yet (it is {record.status})")
    missing = [k for k in dict.fromkeys(wanted) if k not in known]
    if missing and keys:
        raise BadInput(f"--key {missing[0]}: run {run_id} recorded no such metric (it has "
                       f"{', '.join(known) or 'none'})")
    chosen = points[points["key"].isin(wanted)]
    table = chosen.drop_duplicates(["step", "key"], keep="last").pivot(
        index="step", columns="key", values="value")  # a NaN (a diverged step) is kept
    seen = chosen.groupby("step")["examples_seen"].max()
    table = table.reindex(columns=[k for k in dict.fromkeys(wanted) if k in table.columns])
    rows = [{"step": int(step), "examples_seen": None if seen[step] != seen[step]
             else int(seen[step]),
             **{k: (None if v != v else float(v)) for k, v in values.items()}}
            for step, values in table.iterrows()]
    if output_format == "json":
        click.echo(strict_json({"run_id": run_id, "keys": list(table.columns), "points": rows}))
        return
    click.echo(render_rows(rows, output_format))
