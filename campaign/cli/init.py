"""``campaign init DIR``: a task skeleton and a spec to start a study from."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from campaign.errors import BadInput


@click.command()
@click.argument("given", metavar="DIR", type=click.Path(file_okay=False))
def init(given: str) -> None:
    """Write DIR/study_task.py (a campaign.Task on the iris data scikit-learn ships) and
    DIR/spec.toml; from DIR, `campaign plan spec.toml` and `campaign pilot NAME` pass as
    they are. Nothing is overwritten.

    Example: campaign init my-study && cd my-study && campaign plan spec.toml
    """
    from campaign.plan.skeleton import campaign_name, write_skeleton

    if not given.strip():  # Path("") would be the current folder
        raise BadInput("no folder given: name the folder to write the study into (. for here)")
    folder = Path(given)
    written = write_skeleton(folder)
    name = campaign_name(folder)
    for path in written:
        click.echo(str(path))
    click.echo(f"campaign: wrote a task and a spec for campaign {name!r}; next: cd "
               f"{shlex.quote(str(folder))} && campaign plan spec.toml && campaign inspect "
               f"{shlex.quote(name)} && campaign pilot {shlex.quote(name)}",
               err=True)
