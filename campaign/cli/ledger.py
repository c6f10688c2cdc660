"""Ledger commands: campaigns, db current, db upgrade (thin: parse, call, print)."""

from __future__ import annotations

import click

from campaign.cli.output import output_options, render_rows
from campaign.cli.source import LedgerSource


@click.command("campaigns")
@output_options
@click.pass_obj
def campaigns(source: LedgerSource, output_format: str) -> None:
    """List the campaigns in the ledger with their number of runs.

    Example: campaign campaigns --format json
    """
    with source.open() as ledger:
        frame = ledger.campaigns()
    rows = [
        {"name": r.name, "runs": int(r.runs), "task": r.task,
         "created_at": r.created_at.isoformat(), "question": r.question}
        for r in frame.itertuples()
    ]
    click.echo(render_rows(rows, output_format))


@click.group()
def db() -> None:
    """Ledger schema: show the revision, upgrade an older ledger.

    Example: campaign db upgrade
    """


@db.command("current")
@output_options
@click.pass_obj
def db_current(source: LedgerSource, output_format: str) -> None:
    """Show the ledger's schema revision and the revision this code needs.

    Example: campaign --ledger postgresql://me@db/lab db current --format json
    """
    from campaign.ledger import migrate

    row = migrate.describe_url(source.url)
    click.echo(render_rows([row], output_format, document=row))


@db.command("upgrade")
@click.argument("revision", default="head")
@click.pass_obj
def db_upgrade(source: LedgerSource, revision: str) -> None:
    """Bring the ledger's schema to REVISION (default: head), keeping every row; creates a
    missing SQLite ledger.

    Example: campaign --ledger sqlite:///campaign.db db upgrade
    """
    from campaign.errors import BadInput
    from campaign.ledger import migrate

    if revision != "head" and not migrate.is_known_revision(revision):
        known = ", ".join(sorted(s.revision for s in migrate.known_scripts()))
        raise BadInput(f"db upgrade: unknown revision {revision!r} (known: {known}, head)")
    where, before, after = migrate.upgrade_url(source.url, revision)
    if before == after:
        click.echo(f"ledger {where} already at revision {after}", err=True)
    else:
        click.echo(f"ledger {where} upgraded from {before or 'empty'} to {after}", err=True)
