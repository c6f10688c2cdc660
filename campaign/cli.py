"""The ``campaign`` command line: thin click commands, no logic beyond parsing and printing.

Exit codes (DESIGN.md §11): 0 success; 1 the checked thing failed; 2 bad
usage or bad input; 3 ledger problem. Errors print one line on stderr,
never a traceback for a user mistake.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from campaign import cli_demo, cli_launch, cli_pilot, cli_plan, cli_report, cli_run
from campaign.ledger import Ledger, LedgerError, LedgerInputError, migrate
from campaign.ledger.engine import (
    DEFAULT_URL,
    ENV_VAR,
    create_ledger_engine,
    parse_url,
)
from campaign.loop.checkpoint import CheckpointError
from campaign.loop.task import TaskContractError
from campaign.loop.train import LoopError
from campaign.output import output_options, render
from campaign.spec import SpecError

EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_LEDGER = 3


class CampaignGroup(click.Group):
    """Turns the project's own errors into one stderr line and the contract's exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LedgerError as error:
            click.echo(f"campaign: ledger error: {error}", err=True)
            ctx.exit(EXIT_LEDGER)
        except (LedgerInputError, SpecError, LoopError, TaskContractError) as error:
            click.echo(f"campaign: {error}", err=True)
            ctx.exit(EXIT_BAD_INPUT)
        except CheckpointError as error:
            click.echo(f"campaign: {error}", err=True)
            ctx.exit(EXIT_CHECK_FAILED)


class LedgerSource:
    """The ledger URL chosen on the command line; opened only by commands that need it."""

    def __init__(self, url: str) -> None:
        self.url = url

    def open(self, *, check: bool = True) -> Ledger:
        return Ledger.open(self.url, check=check)


@click.group(cls=CampaignGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--ledger",
    "ledger_url",
    envvar=ENV_VAR,
    default=DEFAULT_URL,
    show_default=True,
    metavar="URL",
    help=f"Ledger database: sqlite:///PATH or postgresql://USER@HOST/DB (env {ENV_VAR}).",
)
@click.version_option(package_name="campaign")
@click.pass_context
def main(ctx: click.Context, ledger_url: str) -> None:
    """Run PyTorch training-experiment campaigns with the discipline of a careful lab.

    Example: campaign --ledger sqlite:///campaign.db db current
    """
    ctx.obj = LedgerSource(ledger_url)


@main.command("campaigns")
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
    ]  # fmt: skip
    click.echo(render(rows, output_format))


@main.group(cls=CampaignGroup)
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
    row = migrate.describe(parse_url(source.url))
    click.echo(render([row], output_format, document=row))


@db.command("upgrade")
@click.argument("revision", default="head")
@click.pass_obj
def db_upgrade(source: LedgerSource, revision: str) -> None:
    """Bring the ledger's schema to REVISION (default: head), keeping every row.

    Example: campaign --ledger sqlite:///campaign.db db upgrade
    """
    engine = create_ledger_engine(parse_url(source.url))
    try:
        before = migrate.current_revision(engine)
        migrate.upgrade(engine, revision)
        after = migrate.current_revision(engine)
    finally:
        engine.dispose()
    where = engine.url.render_as_string(hide_password=True)
    if before == after:
        click.echo(f"ledger {where} already at revision {after}", err=True)
    else:
        click.echo(f"ledger {where} upgraded from {before or 'empty'} to {after}", err=True)


cli_plan.register(main)
cli_run.register(main)
cli_pilot.register(main)
cli_launch.register(main)
cli_report.register(main)
cli_demo.register(main)

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
