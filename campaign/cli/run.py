"""Run commands: run, resume, replay (thin: parse, call the loop, print)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from campaign.cli.options import (
    artifacts_option,
    device_option,
    ranks_option,
    skip_reason,
    stop_grace_option,
)
from campaign.cli.output import output_options
from campaign.cli.source import LedgerSource

REPLAY_TIMEOUT_S = 600.0  # the replay of a final artifact, in a child of the task host

if TYPE_CHECKING:
    from campaign.ledger import Ledger


def _execute(
    source: LedgerSource,
    run_id: str,
    artifacts: Path,
    device: str,
    *,
    expect: str,
    skip: str | None = None,
    grace_s: float = 30.0,
    replay: bool = True,
    ranks: int | None = None,
) -> None:
    """Run or resume ``run_id`` in this process; exit 1 unless it completed or stopped.
    A planned run starts only through the pilot gate of its class (or a recorded skip)."""
    from campaign.host.client import start_early
    from campaign.launch.defaults import RUN_PRELOAD

    # The run forks from it: torch and the loop import while this process imports the
    # ledger's code and reads the run and its gate (a bad run id ends the host at once).
    start_early(RUN_PRELOAD)
    with source.open(ride_out=True) as ledger:  # the supervisor rides out an outage
        record = ledger.run(run_id)
        status = record.status
        if expect == "planned" and status != "planned":
            hint = " (use `campaign resume`)" if status in ("interrupted", "lost") else ""
            raise click.UsageError(f"run {run_id} is {status}, not planned{hint}")
        if expect == "resumable" and status not in ("interrupted", "lost"):
            raise click.UsageError(
                f"run {run_id} is {status}: only interrupted or lost runs resume"
            )
        from campaign.launch.worker import WorkerOptions, execute_one, refuse_unfit_run

        refuse_unfit_run(ledger, run_id, device, ranks)  # nothing claimed or changed when refused
        if expect == "planned":
            _gate(ledger, record.campaign, run_id, skip)

        options = WorkerOptions(record.campaign, artifacts, device, grace_s=grace_s,
                                replay_in_subprocess=replay, ranks=ranks)
        outcome = execute_one(ledger, run_id, options)
        _warn_about_flags(ledger, run_id)
    click.echo(
        f"run {outcome.run_id}: {outcome.status} ({outcome.cause}) at update "
        f"{outcome.step}: {outcome.detail}",
        err=True,
    )
    if outcome.status not in ("completed", "stopped"):
        raise click.exceptions.Exit(1)


def _gate(ledger: Ledger, campaign: str, run_id: str, skip: str | None) -> None:
    from campaign.errors import GateClosed
    from campaign.gates.launch_gate import open_gate

    try:
        open_gate(ledger, campaign, skip_reason=skip, who=f"run {run_id}", run_ids=[run_id])
    except GateClosed as closed:
        click.echo(f"campaign: run {run_id}: {closed}", err=True)
        raise click.exceptions.Exit(1) from None


def _warn_about_flags(ledger: Ledger, run_id: str) -> None:
    """The run's own integrity flags, on stderr: a completed run whose final artifact does not
    replay identically keeps its status, but nobody should learn of it from the report only."""
    from campaign.report.flags import event_flags

    record = ledger.run(run_id)
    for flag in event_flags(ledger.events(record.campaign, run_id=run_id)):
        click.echo(f"campaign: warning: run {run_id}: {flag['kind']}: {flag['detail']}", err=True)


@click.command()
@click.argument("run_id")
@artifacts_option
@device_option
@stop_grace_option
@click.option("--skip-pilot", is_flag=True,
              help="Run without a passing pilot of its gate class (needs --reason; recorded).")
@click.option("--reason", default=None, help="Why the pilot is skipped (recorded).")
@click.option("--no-replay-check", is_flag=True,
              help="Skip replaying the final artifact in a fresh process before the run ends.")
@click.pass_obj
def run(source: LedgerSource, run_id: str, artifacts: Path, device: str, stop_grace_s: float,
        skip_pilot: bool, reason: str | None, no_replay_check: bool) -> None:
    """Execute one planned run in this process (what a worker calls).

    The run's gate class needs a passing pilot (`campaign pilot`), or --skip-pilot
    --reason TEXT. Exit code 0 when it completes (or stops by its rules), 1 when the
    gate refuses it, it diverges, fails (in setup too), runs out of memory or is
    interrupted.

    Example: campaign run 01jd8x3m5k2q9w7c4v6b1n0r8t --device cpu
    """
    _execute(source, run_id, artifacts, device, expect="planned",
             skip=skip_reason(skip_pilot, reason), grace_s=stop_grace_s,
             replay=not no_replay_check)


@click.command()
@click.argument("run_id")
@artifacts_option
@device_option
@stop_grace_option
@ranks_option
@click.option("--no-replay-check", is_flag=True,
              help="Skip replaying the final artifact in a fresh process before the run ends.")
@click.pass_obj
def resume(source: LedgerSource, run_id: str, artifacts: Path, device: str,
           stop_grace_s: float, ranks: int | None, no_replay_check: bool) -> None:
    """Continue an interrupted or lost run from its last verified checkpoint (same id, new segment).

    Example: campaign resume 01jd8x3m5k2q9w7c4v6b1n0r8t --ranks 2
    """
    _execute(source, run_id, artifacts, device, expect="resumable", grace_s=stop_grace_s,
             replay=not no_replay_check, ranks=ranks)


@click.command()
@click.argument("run_id")
@device_option
@output_options
@click.pass_obj
def replay(source: LedgerSource, run_id: str, device: str, output_format: str) -> None:
    """Reload a run's final artifact in a fresh process and replay the task's control inputs
    (on --device when this machine has it, else the CPU).

    Exit code 0 when the outputs are identical to those recorded at export, 1 otherwise.

    Example: campaign replay 01jd8x3m5k2q9w7c4v6b1n0r8t --format json
    """
    from campaign.host import calls
    from campaign.loop import loop_entries

    with source.open() as ledger:  # a missing ledger or run id ends here, nothing started
        record = ledger.run(run_id)
        task = ledger.campaign(record.campaign).task
        url = ledger.engine.url.render_as_string(hide_password=False)
    result = calls.call(loop_entries.replay_recorded, url, run_id, device, task=task,
                        preload=calls.CHECK_PRELOAD,
                        what=f"replaying run {run_id}", timeout_s=REPLAY_TIMEOUT_S)
    if output_format == "json":
        click.echo(json.dumps(result, default=str))
    word = "identical" if result["identical"] else "DIFFER"
    click.echo(f"run {run_id}: control outputs {word} after reload", err=True)
    if not result["identical"]:
        raise click.exceptions.Exit(1)


@click.command()
@click.argument("run_id")
@click.option("--updates", default="1:10", show_default=True, metavar="FIRST:LAST",
              help="The updates to show (1-based, inclusive).")
@output_options
@click.pass_obj
def order(source: LedgerSource, run_id: str, updates: str, output_format: str) -> None:
    """Which example ids each update of RUN_ID used, microbatch by microbatch: recomputed from
    the run's frozen config and its task's training split (the same whatever ran it).

    Example: campaign order 01jd8x3m5k2q9w7c4v6b1n0r8t --updates 100:105 --format json
    """
    from campaign.cli.output import render_rows
    from campaign.errors import BadInput
    from campaign.host import calls
    from campaign.loop import loop_entries

    try:
        first, last = (int(part) for part in updates.split(":"))
    except ValueError:
        raise BadInput(f"--updates {updates!r}: expected FIRST:LAST, e.g. 1:10") from None
    if not 1 <= first <= last or last - first >= 10_000:
        raise BadInput(f"--updates {updates!r}: need 1 <= FIRST <= LAST, at most 10,000 updates")
    with source.open() as ledger:
        record = ledger.run(run_id)
        task = ledger.campaign(record.campaign).task
    config = record.config_document
    planned = int(config["budget"]["updates"])
    if first > planned:
        raise BadInput(f"--updates {updates!r}: run {run_id} plans {planned} updates")
    rows = calls.call(loop_entries.update_order, task, config, first,
                      min(last, planned), what="recomputing the data order", task=task)
    if output_format == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    flat = [{**row, "microbatches": " | ".join(" ".join(m) for m in row["microbatches"])}
            for row in rows]
    click.echo(render_rows(flat, output_format))
