"""Pilot commands (thin): inspect."""

from __future__ import annotations

import json
from typing import Any

import click

from campaign.loop.task import build_task
from campaign.output import output_options, render
from campaign.pilot import inspect as inspection
from campaign.pilot.data_gate import check_data, passed


def register(main: click.Group) -> None:
    main.add_command(inspect)


@click.command()
@click.argument("campaign")
@click.option("--n", "count", default=4, show_default=True, help="How many examples to show.")
@click.option("--split", default="train", show_default=True, type=click.Choice(["train", "val"]))
@output_options
@click.pass_obj
def inspect(source: Any, campaign: str, count: int, split: str, output_format: str) -> None:
    """Show examples as the loss receives them, a summary of the split, and the data gate.

    Uses the control's config. Exit code 1 when the data gate fails.

    Example: campaign inspect digits-lr --n 4 --split val
    """
    with source.open() as ledger:
        record = ledger.campaign(campaign)
        runs = ledger.runs(campaign)
    config = runs[runs["is_control"]].iloc[0]["config"]
    task = build_task(record.task, config)
    shown = inspection.examples(task, split, count)
    summary = inspection.summary(task, split, config)
    findings = check_data(task, config)
    gate = [{"check": f.check, "verdict": "pass" if f.ok else "FAIL", "detail": f.detail,
             "advice": f.advice} for f in findings]  # fmt: skip
    if output_format == "json":
        click.echo(json.dumps({"campaign": campaign, "examples": shown, "summary": summary,
                               "data_gate": gate, "passed": passed(findings)}, indent=2,
                              default=str))  # fmt: skip
    else:
        for example in shown:
            click.echo(f"--- {example['id']}")
            for key, value in example.items():
                if key != "id":
                    text = str(value)
                    click.echo(f"{key}:" + (f"\n{text}" if "\n" in text else f" {text}"))
        click.echo("")
        click.echo(render([{"summary": k, "value": v} for k, v in summary.items()],
                          output_format))  # fmt: skip
        click.echo("")
        click.echo(render(gate, output_format))
    if not passed(findings):
        failed = ", ".join(f.check for f in findings if not f.ok)
        click.echo(f"campaign: data gate failed ({failed})", err=True)
        raise click.exceptions.Exit(1)
