"""Where the ledger comes from: ``--ledger URL`` (before or after the subcommand), else
``CAMPAIGN_LEDGER``, else ``sqlite:///campaign.db`` in the working directory."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from campaign.errors import BadInput
from campaign.ledger.location import DEFAULT_URL, ENV_VAR

if TYPE_CHECKING:
    from campaign.ledger import Ledger

__all__ = ["DEFAULT_URL", "ENV_VAR", "LedgerSource", "add_ledger_option"]


class LedgerSource:
    """The ledger URL chosen on the command line; opened only by commands that need it."""

    def __init__(self, url: str) -> None:
        self.url = url

    def open(self, *, create: bool = False, check: bool = True, ride_out: bool = False) -> Ledger:
        """Open the ledger; only ``plan``, ``demo`` and ``db upgrade`` may create one.
        ``ride_out``: a command that lives through a campaign (run, resume, worker, launch)
        rides out a ledger outage (docs/runs.md) rather than ending at its first blink."""
        from campaign.ledger import Ledger

        if _in_memory(self.url):
            raise BadInput(f"--ledger {self.url}: an in-memory SQLite ledger ends with this "
                           "command and keeps nothing: name a file (sqlite:///campaign.db)")
        if ride_out:  # these commands claim runs: none on a file that cannot take writes
            _refuse_unwritable(self.url)
        return Ledger.open(self.url, create=create, check=check, ride_out=ride_out)


def _in_memory(text: str) -> bool:
    """Whether ``text`` is a SQLite URL of no file (``sqlite://``, ``sqlite:///:memory:``)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from campaign.ledger.connections import sqlite_path

    try:
        url = make_url(text)
    except (ArgumentError, ValueError):  # (a port that is not a number: ValueError)
        return False  # Ledger.open says what is wrong with it
    return url.get_backend_name() == "sqlite" and sqlite_path(url) is None


def _refuse_unwritable(text: str) -> None:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from campaign.ledger.writable import refuse_if_unwritable

    try:
        url = make_url(text)
    except ArgumentError:
        return  # Ledger.open says what is wrong with it
    refuse_if_unwritable(url)


def empty_ledger(where: str) -> None:
    """An empty ledger URL is an unset variable, never "the default": one line, exit 2 (the
    default would be created silently in the working folder)."""
    click.echo(f"campaign: {where} is empty (an unset variable?): give a ledger URL, or "
               "leave it out for the default sqlite:///campaign.db", err=True)
    raise click.exceptions.Exit(2)


def _take_ledger(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is None:
        return
    if not value.strip():
        empty_ledger("--ledger")
    source = ctx.find_object(LedgerSource)
    if source is None:
        ctx.obj = LedgerSource(value)
    else:
        source.url = value


def add_ledger_option(command: click.Command) -> None:
    """Let ``command`` (and a group's subcommands) take the global ``--ledger`` after its name."""
    if not any(param.name == "ledger_after" for param in command.params):
        command.params.append(
            click.Option(
                ["--ledger", "ledger_after"],
                metavar="URL",
                expose_value=False,
                callback=_take_ledger,
                help="The ledger (same as the global --ledger given before the command).",
            )
        )
    if isinstance(command, click.Group):
        for subcommand in command.commands.values():
            add_ledger_option(subcommand)
