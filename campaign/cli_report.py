"""Report command (thin): the balance sheet in one of five formats."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from campaign.report.balance import balance_sheet
from campaign.report.render import FORMATS, render, write


def register(main: click.Group) -> None:
    main.add_command(report)


@click.command()
@click.argument("campaign")
@click.option("--format", "output_format", type=click.Choice(FORMATS), default="html",
              show_default=True, help="html (self-contained), md, csv/parquet (run table), "
              "json (everything).")  # fmt: skip
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="File to write (default CAMPAIGN-report.EXT here); - for stdout "
              "(not parquet).")  # fmt: skip
@click.pass_obj
def report(source: Any, campaign: str, output_format: str, output: Path | None) -> None:
    """Write the campaign's balance sheet: every run on its line, none omitted.

    Per variant: runs planned/completed/diverged/failed/other and the validation
    metric over seeds (mean, std, min, max, n, every value); deltas against the
    control seed by seed; curves of every run; the pilot's phases; the notes.

    Example: campaign report digits-lr --format html --output digits-lr.html
    """
    with source.open() as ledger:
        sheet = balance_sheet(ledger, campaign)
    if output is not None and str(output) == "-":
        if output_format == "parquet":
            raise click.UsageError("--format parquet needs a file (--output PATH)")
        sys.stdout.write(render(sheet, output_format))
        return
    path = output or Path(f"{campaign}-report.{output_format}")
    written = write(sheet, output_format, path)
    click.echo(f"campaign: {campaign}: {len(sheet.runs)} runs -> {written}", err=True)
