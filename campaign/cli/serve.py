"""``campaign serve`` (the read-only dashboard) and ``campaign tensorboard`` (event files)."""

from __future__ import annotations

from pathlib import Path

import click

from campaign.cli.options import seconds
from campaign.cli.source import LedgerSource
from campaign.errors import BadInput


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; any other than loopback requires a token.")
@click.option("--port", default=8321, show_default=True, type=click.IntRange(0, 65535),
              help="Port (0: any free port, printed).")
@click.option("--token", envvar="CAMPAIGN_SERVE_TOKEN", default=None, metavar="TEXT",
              help="Token every request must carry (env CAMPAIGN_SERVE_TOKEN); off loopback "
                   "one is generated when not given.")
@click.option("--access-log", is_flag=True, help="Log every request on stderr.")
@click.pass_obj
def serve(source: LedgerSource, host: str, port: int, token: str | None,
          access_log: bool) -> None:
    """Serve a read-only live dashboard over the ledger: campaigns, live status and curves,
    conclusions, flags, the balance sheet, every run. The URL is printed on stdout.

    Examples: campaign serve · campaign serve --port 0 · campaign serve --host 0.0.0.0
    """
    from campaign.ledger import LedgerReader
    from campaign.serve.dashboard_server import serve

    reader = LedgerReader.open(source.url)
    try:
        serve(reader, host, port, token, access_log=access_log)
    finally:
        reader.close()


@click.command()
@click.argument("campaign_name", metavar="CAMPAIGN")
@click.option("--logdir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder of the event files: one folder per run, VARIANT/seed-S-RUNID.")
@click.option("--follow", is_flag=True,
              help="Keep exporting new points while runs train (Ctrl-C stops).")
@click.option("--every-s", default=5.0, show_default=True, type=seconds(0.2, 3600),
              help="With --follow: seconds between two reads of the ledger.")
@click.pass_obj
def tensorboard(source: LedgerSource, campaign_name: str, logdir: Path, follow: bool,
                every_s: float) -> None:
    """Write CAMPAIGN's curves as TensorBoard event files: every metric as a scalar at its
    update, the config as hyperparameters, the status and stop as text. Only new points are
    written on a second export. Needs the extra: pip install 'campaign[tensorboard]'.

    Example: campaign tensorboard digits-lr --logdir tb --follow  (then: tensorboard --logdir tb)
    """
    from campaign.ledger import LedgerReader
    from campaign.report.tensorboard import export, follow_export

    if not str(logdir).strip() or str(logdir) == ".":
        raise BadInput("--logdir needs a folder of its own (not empty, not '.')")
    reader = LedgerReader.open(source.url)
    try:
        if follow:
            follow_export(reader, campaign_name, logdir, every_s)
        else:
            done = export(reader, campaign_name, logdir)
            click.echo(f"{done.points} new points of {done.runs} runs written to {logdir}",
                       err=True)
    finally:
        reader.close()
