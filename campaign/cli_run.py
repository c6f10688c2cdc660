"""Run commands: run, resume, replay (thin: parse, call the loop, print)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from campaign.loop.replay import replay as replay_final
from campaign.loop.train import execute

ARTIFACTS_ENV = "CAMPAIGN_ARTIFACTS"


def register(main: click.Group) -> None:
    for command in (run, resume, replay):
        main.add_command(command)


def _artifacts_option(command: Any) -> Any:
    return click.option(
        "--artifacts",
        type=click.Path(file_okay=False, path_type=Path),
        default=lambda: os.environ.get(ARTIFACTS_ENV, "campaign-artifacts"),
        show_default="campaign-artifacts (env CAMPAIGN_ARTIFACTS)",
        help="Folder for checkpoints, predictions and final artifacts.",
    )(command)


def _device_option(command: Any) -> Any:
    return click.option(
        "--device", default="cpu", show_default=True, help="torch device: cpu, cuda, cuda:1 ..."
    )(command)


def _execute(source: Any, run_id: str, artifacts: Path, device: str) -> None:
    with source.open() as ledger:
        outcome = execute(ledger, run_id, artifacts=artifacts, device=device)
    line = (
        f"run {outcome.run_id}: {outcome.status} ({outcome.cause}) at update "
        f"{outcome.step}: {outcome.detail}"
    )
    click.echo(line, err=True)
    if outcome.status not in ("completed", "stopped"):
        raise click.exceptions.Exit(1)


@click.command()
@click.argument("run_id")
@_artifacts_option
@_device_option
@click.pass_obj
def run(source: Any, run_id: str, artifacts: Path, device: str) -> None:
    """Execute one planned run in this process (what a worker calls).

    Exit code 0 when it completes (or stops by its rules), 1 when it diverges, fails,
    runs out of memory or is interrupted.

    Example: campaign run 01jd8x3m5k2q9w7c4v6b1n0r8t --device cpu
    """
    with source.open() as ledger:
        status = ledger.run(run_id).status
    if status != "planned":
        hint = " (use `campaign resume`)" if status in ("interrupted", "lost") else ""
        raise click.UsageError(f"run {run_id} is {status}, not planned{hint}")
    _execute(source, run_id, artifacts, device)


@click.command()
@click.argument("run_id")
@_artifacts_option
@_device_option
@click.pass_obj
def resume(source: Any, run_id: str, artifacts: Path, device: str) -> None:
    """Continue an interrupted or lost run from its last verified checkpoint (same id, new segment).

    Example: campaign resume 01jd8x3m5k2q9w7c4v6b1n0r8t
    """
    with source.open() as ledger:
        status = ledger.run(run_id).status
    if status not in ("interrupted", "lost"):
        raise click.UsageError(f"run {run_id} is {status}: only interrupted or lost runs resume")
    _execute(source, run_id, artifacts, device)


@click.command()
@click.argument("run_id")
@click.pass_obj
def replay(source: Any, run_id: str) -> None:
    """Reload a run's final artifact in this process and replay the task's control inputs.

    Example: campaign replay 01jd8x3m5k2q9w7c4v6b1n0r8t
    """
    with source.open() as ledger:
        result = replay_final(ledger, run_id)
    if result["identical"]:
        click.echo(f"run {run_id}: control outputs identical after reload", err=True)
        return
    click.echo(f"run {run_id}: control outputs DIFFER after reload", err=True)
    raise click.exceptions.Exit(1)
