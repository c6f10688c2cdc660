"""Report command (thin): the balance sheet in one of five formats."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from campaign.cli.output import printable
from campaign.cli.source import LedgerSource
from campaign.errors import BadInput
from campaign.report.formats import FORMATS


@click.command()
@click.argument("campaign")
@click.option("--format", "output_format", type=click.Choice(FORMATS), default="html",
              show_default=True, help="html (self-contained), md, csv/parquet (run table), "
              "json (everything).")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="File to write (default CAMPAIGN-report.EXT here); - for stdout "
              "(not parquet).")
@click.pass_obj
def report(source: LedgerSource, campaign: str, output_format: str, output: Path | None) -> None:
    """Write the campaign's balance sheet: the answer first, then the evidence.

    The conclusion (each variant paired by seed with the control: mean delta, 95%
    interval, verdict) and every integrity flag; per variant, over its original
    runs (one per seed): counts by status and the metric over seeds; relaunches
    apart, never pooled; deltas; curves; every run on its line (training time
    apart from overhead); the pilot's phases; the notes. The folder of --output is
    created when missing.

    Example: campaign report digits-lr --format html --output digits-lr.html
    """
    from campaign.report.balance import balance_sheet
    from campaign.report.inputs import campaign_inputs
    from campaign.report.render import render, write

    with source.open() as ledger:
        sheet = balance_sheet(ledger, campaign)
        inputs = campaign_inputs(ledger, campaign)
    if output is not None and str(output) == "-":
        if output_format == "parquet":
            raise click.UsageError("--format parquet needs a file (--output PATH)")
        try:
            sys.stdout.write(render(sheet, output_format))
            sys.stdout.flush()
        except OSError as error:  # a full disk or a closed pipe behind stdout
            raise BadInput(f"cannot write the report to stdout: {error.strerror}") from None
        return
    path = output or Path(f"{campaign}-report.{output_format}")
    try:
        written = write(sheet, output_format, path, inputs)
    except OSError as error:  # a user's path: one line, exit 2, nothing half written
        reason = error.strerror or str(error)
        raise BadInput(f"cannot write the report to {path}: {reason}") from None
    click.echo(f"campaign: {campaign}: {len(sheet.runs)} runs -> {written}", err=True)


@click.command("archive")
@click.argument("campaign")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The .tar.gz to write (default CAMPAIGN-archive.tar.gz here).")
@click.option("--data-limit", "data_limit", default="256M", show_default=True, metavar="SIZE",
              help="Pack at most SIZE of the runs' data (bytes, or with K, M, G); the rest is "
                   "listed by SHA-256 and size only.")
@click.pass_obj
def archive(source: LedgerSource, campaign: str, output: Path | None, data_limit: str) -> None:
    """Pack everything the campaign leaves into one .tar.gz with a manifest of SHA-256s.

    Spec, configs, environments (every installed distribution, the git state with its
    diff), raw metrics, events, predictions, logs, final artifacts, pilot phases, notes,
    the HTML report, the task's own source, the data its runs read (inputs.json) and a
    README on reloading and replaying.

    Example: campaign archive digits-lr --output digits-lr.tar.gz
    """
    from campaign.report.archive import write_archive

    if output is not None and str(output) == "-":  # (it wrote a file named "-")
        raise BadInput("--output -: an archive is a binary .tar.gz written to a file (it is "
                       "checked and renamed into place); name the file")
    path = output or Path(f"{campaign}-archive.tar.gz")
    limit = _size(data_limit)
    with source.open() as ledger:
        try:
            written = write_archive(ledger, campaign, path, data_limit=limit)
        except OSError as error:  # a user's path: one line, exit 2, nothing half written
            reason = error.strerror or str(error)
            raise BadInput(f"cannot write the archive to {path}: {reason}") from None
    click.echo(f"campaign: {campaign} archived to {written} ({written.stat().st_size:,} bytes)",
               err=True)


def _size(text: str) -> int:
    """``--data-limit``: bytes, or a number with K, M or G (powers of 1024)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    number, unit = text.strip().upper().rstrip("IB"), ""
    if number[-1:] in units:
        number, unit = number[:-1], number[-1]
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise BadInput(f"--data-limit: expected a size such as 256M, got {text!r}") from None
    if not value >= 0 or value != value or value == float("inf"):
        raise BadInput(f"--data-limit: expected a size of 0 or more, got {text!r}")
    return int(value)


@click.command("verify-archive")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def verify_archive_command(path: Path) -> None:
    """Check every member of an archive against its manifest; exit 1 naming what differs.

    Example: campaign verify-archive digits-lr-archive.tar.gz
    """
    from campaign.report.archive_check import verify_archive

    # an unusable input exits 2, an archive that does not verify 1 (campaign.errors)
    verified = verify_archive(path)
    click.echo(f"campaign: {printable(str(path))}: {verified.members} members, "
               f"{verified.bytes:,} bytes, every SHA-256 verified", err=True)
