"""Launch commands (thin): launch, worker, status."""

from __future__ import annotations

import functools
import json
import signal
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from campaign.cli.options import (
    FiniteRange,
    artifacts_option,
    max_requeues_option,
    ranks_option,
    seconds,
    skip_reason,
    stop_grace_option,
)
from campaign.cli.output import output_options, render_rows
from campaign.cli.source import LedgerSource
from campaign.errors import LedgerError, LedgerUnreachable, first_line
from campaign.launch.defaults import DEFAULT_HEARTBEAT_S, DEFAULT_LEASE_S, EXECUTORS


def _worker_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by `launch` and `worker`: heartbeat, lease, resume, pilot gate."""
    decorators = [
        artifacts_option,
        stop_grace_option,
        click.option("--heartbeat-s", type=seconds(0.1), default=DEFAULT_HEARTBEAT_S,
                     show_default=True, help="Seconds between a running run's heartbeats."),
        click.option("--lease-s", type=seconds(0.3), default=DEFAULT_LEASE_S,
                     show_default=True,
                     help="Heartbeat age after which a running run is declared lost "
                     "(at least 3 heartbeats)."),
        click.option("--resume-lost", is_flag=True,
                     help="Also continue lost runs from their last verified checkpoint."),
        click.option("--resume-interrupted", is_flag=True,
                     help="Also continue interrupted runs from their last verified checkpoint."),
        click.option("--skip-pilot", is_flag=True,
                     help="Launch without a passing pilot (needs --reason; recorded)."),
        click.option("--reason", default=None, help="Why the pilot is skipped (recorded)."),
        click.option("--no-replay-check", is_flag=True,
                     help="Skip reloading each final artifact in a fresh process."),
        ranks_option,
    ]
    return functools.reduce(lambda c, d: d(c), reversed(decorators), command)


def _options(campaign: str, artifacts: Path, **kw: Any) -> Any:
    from campaign.launch.worker import WorkerOptions

    resume = tuple(s for s in ("lost", "interrupted") if kw.get(f"resume_{s}"))
    try:
        return WorkerOptions(
            campaign=campaign, artifacts=artifacts, device=kw.get("device", "cpu"),
            heartbeat_s=kw["heartbeat_s"], lease_s=kw["lease_s"], resume=resume,
            threads=kw.get("threads"), max_runs=kw.get("max_runs"),
            replay_in_subprocess=not kw["no_replay_check"], grace_s=kw["stop_grace_s"],
            ranks=kw.get("ranks"),
        )
    except ValueError as error:
        raise click.UsageError(str(error)) from None


def _say_gate(decision: Any) -> None:
    for warning in decision.stack_warnings:
        _say_stack_warning(warning)


def _say_stack_warning(warning: str) -> None:
    click.echo(f"campaign: warning: stack differs from the pilot's: {warning}", err=True)


def _gate(ledger: Any, campaign: str, skip_pilot: bool, reason: str | None, who: str) -> None:
    from campaign.errors import GateClosed
    from campaign.gates.launch_gate import open_gate

    why = skip_reason(skip_pilot, reason)
    try:
        decision = open_gate(ledger, campaign, skip_reason=why, who=who)
    except GateClosed as closed:
        click.echo(f"campaign: {closed}", err=True)
        raise click.exceptions.Exit(1) from None
    _say_gate(decision)


@click.command()
@click.argument("campaign")
@click.option(
    "--workers",
    type=click.IntRange(1),
    default=None,
    help="Worker processes (default: one per device; 1 on cpu).",
)
@click.option(
    "--devices",
    default="cpu",
    show_default=True,
    help="cpu, cuda (all visible) or a list: cuda:0,cuda:1.",
)
@click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True)
@click.option(
    "--address",
    default=None,
    help="ray: the cluster address (default: RAY_ADDRESS, else start a private local "
    "instance).",
)
@click.option(
    "--gpus-per-run",
    type=FiniteRange(0, 1024),
    default=None,
    help="ray/slurm: GPUs each worker task asks for (default: 1 with cuda devices, else 0).",
)
@click.option(
    "--ray-placement",
    type=click.Choice(("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"), case_sensitive=False),
    default="PACK",
    show_default=True,
    help="ray: where a run's ranks go (a placement group of W bundles per worker, Ray's "
    "strategies): PACK on as few nodes as fit, STRICT_SPREAD each rank on a node of its own.",
)
@click.option(
    "--schedule-timeout-s",
    type=seconds(1),
    default=600,
    show_default=True,
    help="ray: give up when no run could start within this time.",
)
@click.option(
    "--slurm-folder",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="slurm: folder (created 0700) for the batch script and the tasks' logs "
    "(default: ARTIFACTS/slurm).",
)
@click.option("--slurm-partition", default=None, help="slurm: partition to submit to.")
@click.option(
    "--slurm-time-min",
    type=click.IntRange(1),
    default=60,
    show_default=True,
    help="slurm: time limit of each array task in minutes.",
)
@click.option(
    "--slurm-signal-s",
    type=click.IntRange(1, 65535),
    default=120,
    show_default=True,
    help="slurm: SIGUSR2 this long before the time limit (the run checkpoints, the task requeues).",
)
@max_requeues_option
@click.option(
    "--grace-s",
    type=seconds(1),
    default=300,
    show_default=True,
    help="After SIGTERM, how long workers get to checkpoint before they are killed.",
)
@_worker_options
@output_options
@click.pass_obj
def launch(source: LedgerSource, campaign: str, workers: int | None, devices: str, executor: str,
           address: str | None, gpus_per_run: float | None, ray_placement: str,
           schedule_timeout_s: float, slurm_folder: Path | None, slurm_partition: str | None,
           slurm_time_min: int,
           slurm_signal_s: int, max_requeues: int, grace_s: float, skip_pilot: bool,
           reason: str | None, artifacts: Path, output_format: str, **kw: Any) -> None:
    """Execute a campaign's planned runs on workers that claim them from the ledger.

    Refuses (exit 1) without a passing pilot for the frozen spec unless
    --skip-pilot --reason TEXT (recorded). Exit code 0 when every run ended and none
    failed, ran out of memory, or was interrupted or lost; 1 otherwise; diverged runs
    are results. SIGTERM/SIGINT: running runs checkpoint and end interrupted.

    Example: campaign launch digits-lr --workers 4 --devices cpu
    """
    if executor == "local":  # its workers share this host: torch imports while the gate reads
        from campaign.host.client import start_early
        from campaign.launch.defaults import RUN_PRELOAD

        start_early(RUN_PRELOAD)
    from campaign.launch.policy import LaunchRefused, LaunchRequest, launch_campaign

    request = LaunchRequest(
        options=_options(campaign, artifacts, **kw), executor=executor, workers=workers,
        devices=devices, skip_reason=skip_reason(skip_pilot, reason), address=address,
        gpus_per_run=gpus_per_run, schedule_timeout_s=schedule_timeout_s,
        ray_placement=ray_placement.upper(), slurm_folder=slurm_folder,
        slurm_partition=slurm_partition,
        slurm_time_min=slurm_time_min, slurm_signal_s=slurm_signal_s, max_requeues=max_requeues,
        grace_s=grace_s,
    )
    with source.open(ride_out=True) as ledger:
        try:
            outcome = launch_campaign(ledger, source.url, request, on_gate=_say_gate)
        except LaunchRefused as error:
            raise click.UsageError(str(error)) from None
        except LedgerUnreachable as error:  # away past the limit: its runs stop at checkpoints
            from campaign.launch.left_behind import continue_command

            click.echo(f"campaign: {first_line(error)}", err=True)
            click.echo("campaign: the runs this launch left end interrupted (or lost) once the "
                       "ledger answers; then " + continue_command(
                           campaign, {"interrupted", "lost"}, _as_given(source)), err=True)
            raise click.exceptions.Exit(error.exit_code) from None
    if output_format == "json":
        click.echo(json.dumps(outcome.snapshot.document(), indent=2))
    for refusal in outcome.refusals:
        click.echo(f"campaign: worker {refusal}", err=True)
    if outcome.interrupted:
        click.echo("campaign: launch interrupted", err=True)
    if outcome.unfinished:
        from campaign.launch.left_behind import left_behind

        what = ", ".join(f"{n} {s}" for s, n in outcome.attention.items()) or "runs left"
        click.echo(f"campaign: {campaign}: {what}", err=True)
        try:
            with source.open() as ledger:  # which runs, where each stands, and how to go on
                lines = left_behind(ledger, campaign, _as_given(source))
        except LedgerError as error:
            lines = [f"the runs left cannot be listed: {first_line(error)}",
                     f"see them later with: campaign status {campaign}"]
        for line in lines:
            click.echo(f"campaign: {line}", err=True)
        raise click.exceptions.Exit(1)


# What the launch was told that a continuing launch must be told again: where and on what it
# runs (the resume flags and the output format are the continuing command's own).
_NOT_REPEATED = {"resume_lost", "resume_interrupted", "output_format", "campaign"}


def _as_given(source: LedgerSource) -> list[str]:
    """The options of this launch as given on its command line, and the ledger when it is not
    the one the environment names, so the command to continue is the one to paste."""
    import shlex

    from click.core import ParameterSource
    from sqlalchemy.engine import make_url

    from campaign.ledger.connections import safe_url
    from campaign.ledger.location import resolve_url

    context = click.get_current_context()
    given = []
    if source.url != resolve_url(None):  # a password stays hidden: the user knows it
        given += ["--ledger", shlex.quote(safe_url(make_url(source.url)))]
    for param in context.command.params:
        if (not isinstance(param, click.Option) or param.name in _NOT_REPEATED
                or context.get_parameter_source(param.name or "") != ParameterSource.COMMANDLINE):
            continue
        value, name = context.params.get(param.name or ""), param.opts[-1]
        if param.is_flag:
            given += [name] if value else []
        elif value is not None:
            given += [name, shlex.quote(str(value))]
    return given


@click.command()
@click.argument("campaign")
@click.option("--device", default="cpu", show_default=True, help="torch device: cpu, cuda:0 ...")
@click.option(
    "--threads",
    type=click.IntRange(1),
    default=None,
    help="torch CPU threads of this worker (default: torch's choice).",
)
@click.option("--max-runs", type=click.IntRange(1), default=None, help="Stop after this many runs.")
@click.option(
    "--slurm",
    "slurm_task",
    is_flag=True,
    help="This worker is a SLURM array task: SIGUSR2 announces preemption (the run checkpoints "
    "and ends preempted, then the task requeues itself); preempted runs are resumed first.",
)
@max_requeues_option
@click.option(
    "--launched",
    is_flag=True,
    hidden=True,
    help="Started by `campaign launch`, which already checked the pilot gate.",
)
@_worker_options
@click.pass_obj
def worker(source: LedgerSource, campaign: str, skip_pilot: bool, reason: str | None,
           artifacts: Path, launched: bool, slurm_task: bool, max_requeues: int,
           **kw: Any) -> None:
    """Run one plain worker: claim runs of CAMPAIGN from the ledger until none is left.

    Start one on each machine that shares a PostgreSQL ledger, no engine needed.
    Exit code 0 when the work ran out, 1 when stopped by SIGTERM/SIGINT (its run
    ended interrupted), 3 when its lease was taken away (another worker owns its run).

    Example: campaign --ledger postgresql://me@db/lab worker digits-lr --device cuda:0
    """
    from campaign.host.client import start_early
    from campaign.launch.defaults import RUN_PRELOAD

    # First: its runs fork from it, and torch with the loop's modules import there while this
    # process imports the ledger's code and reads the gate and the stack (the critical path
    # to a launch's first update).
    start_early(RUN_PRELOAD)
    options = _options(campaign, artifacts, **kw)
    if slurm_task:
        options = replace(options, preempt_signals=(int(signal.SIGUSR2),), resume_preempted=True)
    try:
        report, left = _work(source, campaign, options, launched, skip_pilot, reason,
                             slurm_task)
    except LedgerUnreachable:  # an outage past CAMPAIGN_LEDGER_OUTAGE_S: as a preemption, a
        if slurm_task:  # SLURM task goes back in the queue, to find its runs when it is back
            _requeue(max_requeues, "the ledger is unreachable")
        raise
    if report.signal_name:  # a stop, not an error (a SLURM task's log says so: launch reads it)
        click.echo(f"campaign: worker {report.worker} stopped by {report.signal_name}", err=True)
    if left:
        _requeue(max_requeues)
    if report.stopped_by_signal:
        raise click.exceptions.Exit(1)


def _work(source: LedgerSource, campaign: str, options: Any, launched: bool,
          skip_pilot: bool, reason: str | None, slurm_task: bool) -> tuple[Any, bool]:
    """The worker's runs, and whether a SLURM task leaves work for a requeued self."""
    from campaign.launch.slurm_task import work_for_a_requeued_task
    from campaign.launch.worker import run_worker
    from campaign.ledger.locality import check_single_host

    with source.open(ride_out=True) as ledger:
        ledger.campaign(campaign)
        check_single_host(ledger, options.lease_s)
        if not launched or skip_pilot:
            _gate(ledger, campaign, skip_pilot, reason, who="worker")
        else:  # the launcher checked the gate; the stack is this worker's to compare (in the
            # child of its host that checks the stack's fitness, before the first claim)
            options = replace(options, compare_stack_as="launch worker")

        def tell(outcome: Any) -> None:
            click.echo(
                f"run {outcome.run_id}: {outcome.status} ({outcome.cause}) at update "
                f"{outcome.step}",
                err=True,
            )

        report = run_worker(ledger, options, on_outcome=None if launched else tell,
                            on_warning=_say_stack_warning)
        return report, bool(slurm_task and report.preempted
                            and work_for_a_requeued_task(ledger, campaign))


def _requeue(max_requeues: int, why: str = "preempted") -> None:
    """A preempted SLURM array task goes back in the queue (its run is checkpointed); so does
    one that the ledger left (its run ends interrupted, or lost, and is resumed first)."""
    from campaign.launch.slurm_task import RequeueRefused, requeue, this_task

    task = this_task()
    if task is None:
        click.echo("campaign: --slurm outside a SLURM job: nothing to requeue", err=True)
        return
    if task.restarts >= max_requeues:
        click.echo(f"campaign: {why}; SLURM task {task.name} used its {max_requeues} "
                   "requeue(s): the run stays interrupted (launch --resume-interrupted)",
                   err=True)
        return
    # Said first: SLURM ends this process as it requeues the task, before any later line.
    click.echo(f"campaign: {why}; requeueing SLURM task {task.name} "
               f"({task.restarts + 1} of {max_requeues})", err=True)
    try:
        requeue(task)
    except RequeueRefused as refused:
        click.echo(f"campaign: {refused}; the run stays interrupted", err=True)


@click.command()
@click.argument("campaign")
@output_options
@click.pass_obj
def status(source: LedgerSource, campaign: str, output_format: str) -> None:
    """Where a campaign stands, from the ledger: done, running (update counter), left, ETA.

    Example: campaign status digits-lr --format json
    """
    from campaign.ledger.progress import format_duration, take_snapshot

    with source.open() as ledger:
        snapshot = take_snapshot(ledger, campaign)
    if output_format == "json":
        click.echo(json.dumps(snapshot.document(), indent=2))
        return
    click.echo(snapshot.summary(), err=output_format == "csv")
    rows = [
        {"run_id": r.run_id, "variant": r.variant, "seed": r.seed, "worker": r.worker,
         "update": r.step, "updates": r.updates, "heartbeat_age_s": r.heartbeat_age_s}
        for r in snapshot.running
    ]
    if rows or output_format == "csv":
        click.echo(render_rows(rows, output_format))
    if output_format == "table":
        click.echo(f"ETA {format_duration(snapshot.eta_s)}")
