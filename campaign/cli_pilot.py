"""Pilot commands (thin): inspect, pilot, size, doctor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pandas as pd

from campaign.cli_run import _artifacts_option, _device_option
from campaign.ledger import LedgerInputError, migrate
from campaign.loop.task import build_task
from campaign.loop.train import environment
from campaign.output import output_options, render
from campaign.pilot import inspect as inspection
from campaign.pilot import sizing
from campaign.pilot.data_gate import check_data, passed
from campaign.pilot.gates import PilotOptions, run_pilot


def register(main: click.Group) -> None:
    for command in (inspect, pilot, size, doctor):
        main.add_command(command)


@click.command()
@click.argument("campaign")
@click.option("--n", "count", default=4, show_default=True, help="How many examples to show.")
@click.option("--split", default="train", show_default=True, type=click.Choice(["train", "val"]))
@output_options
@click.pass_obj
def inspect(source: Any, campaign: str, count: int, split: str, output_format: str) -> None:
    """Show examples as the loss receives them, a summary of the split, and the data gate.

    Uses the control's config. Exit code 1 when the data gate fails.

    Example: campaign inspect digits-lr --n 4 --split val
    """
    with source.open() as ledger:
        record = ledger.campaign(campaign)
        runs = ledger.runs(campaign)
    config = runs[runs["is_control"]].iloc[0]["config"]
    task = build_task(record.task, config)
    shown = inspection.examples(task, split, count)
    summary = inspection.summary(task, split, config)
    findings = check_data(task, config)
    gate = [
        {
            "check": f.check,
            "verdict": "pass" if f.ok else "FAIL",
            "detail": f.detail,
            "advice": f.advice,
        }
        for f in findings
    ]
    if output_format == "json":
        click.echo(
            json.dumps(
                {
                    "campaign": campaign,
                    "examples": shown,
                    "summary": summary,
                    "data_gate": gate,
                    "passed": passed(findings),
                },
                indent=2,
                default=str,
            )
        )
    else:
        for example in shown:
            click.echo(f"--- {example['id']}")
            for key, value in example.items():
                if key != "id":
                    text = str(value)
                    click.echo(f"{key}:" + (f"\n{text}" if "\n" in text else f" {text}"))
        click.echo("")
        click.echo(render([{"summary": k, "value": v} for k, v in summary.items()], output_format))
        click.echo("")
        click.echo(render(gate, output_format))
    if not passed(findings):
        failed = ", ".join(f.check for f in findings if not f.ok)
        click.echo(f"campaign: data gate failed ({failed})", err=True)
        raise click.exceptions.Exit(1)


@click.command()
@click.argument("campaign")
@_artifacts_option
@_device_option
@click.option(
    "--overfit-examples",
    default=8,
    show_default=True,
    type=click.IntRange(1),
    help="Training examples the overfit gate must learn.",
)
@click.option(
    "--overfit-steps",
    default=60,
    show_default=True,
    type=click.IntRange(1),
    help="Updates the overfit gate may take.",
)
@click.option(
    "--overfit-factor",
    default=5.0,
    show_default=True,
    type=click.FloatRange(1),
    help="By how much the overfit loss must fall.",
)
@output_options
@click.pass_obj
def pilot(
    source: Any,
    campaign: str,
    artifacts: Path,
    device: str,
    overfit_examples: int,
    overfit_steps: int,
    overfit_factor: float,
    output_format: str,
) -> None:
    """One recorded pass through every phase on the campaign's worst case; exit 1 on a failure.

    Example: campaign pilot digits-lr --device cpu
    """
    options = PilotOptions(overfit_examples, overfit_steps, overfit_factor)
    with source.open() as ledger:
        report = run_pilot(ledger, campaign, artifacts=artifacts, device=device, options=options)
    rows = [
        {
            "phase": r.phase,
            "verdict": r.verdict,
            "duration_s": None if r.duration_s is None else round(r.duration_s, 4),
            "allocated_peak": r.allocated_peak,
            "reserved_peak": r.reserved_peak,
            "rss_peak": r.rss_peak,
            "detail": r.detail,
        }
        for r in report.records
    ]
    document = {
        "campaign": campaign,
        "pilot_id": report.pilot_id,
        "variant": report.variant,
        "passed": report.passed,
        "phases": rows,
    }
    click.echo(render(rows, output_format, document=document))
    verdict = "passed" if report.passed else "FAILED"
    click.echo(
        f"campaign: pilot {report.pilot_id} of {campaign!r} (variant {report.variant}) {verdict}",
        err=True,
    )
    if not report.passed:
        raise click.exceptions.Exit(1)


@click.command()
@click.argument("campaign")
@click.option(
    "--device",
    "target",
    default=None,
    help="The device type being sized for (default: the pilot's).",
)
@click.option(
    "--reserve",
    default=0.2,
    show_default=True,
    type=click.FloatRange(0, 10),
    help="Evaluation/export reserve, as a fraction of the compute time.",
)
@output_options
@click.pass_obj
def size(
    source: Any, campaign: str, target: str | None, reserve: float, output_format: str
) -> None:
    """The sizing sheet from the latest pilot: memory per phase, time, and the rental that fits.

    Example: campaign size digits-lr --reserve 0.25
    """
    with source.open() as ledger:
        phases = ledger.phases(campaign)
        runs = ledger.runs(campaign)
        pilot_environment = _latest_pilot_environment(ledger, campaign)
    phases = phases[phases["pilot_id"].notna()]
    if phases.empty:
        raise LedgerInputError(f"campaign {campaign!r} has no pilot yet: run `campaign pilot`")
    latest = phases[phases["pilot_id"] == phases["pilot_id"].max()]
    duration = dict(zip(latest["phase"], latest["duration_s"], strict=False))
    config = runs.iloc[0]["config"]
    count = sizing.counts(config)
    projection = sizing.project(
        update_s=float(duration["update"]),
        validation_s=float(duration["validation"]),
        checkpoint_s=float(duration["checkpoint"]),
        runs=len(runs),
        reserve=reserve,
        **count,
    )
    loop = config["loop"]
    pilot_device = str(latest["device"].iloc[0])
    header = {
        "campaign": campaign,
        "runs": len(runs),
        **count,
        "precision": loop["precision"],
        "microbatch": loop["microbatch"],
        "accumulation": loop["accumulation"],
        "strategy": f"data replicas x{loop['replicas']}",
        "pilot_device": pilot_device,
        "devices": ", ".join((pilot_environment or {}).get("devices", [])),
        "torch": (pilot_environment or {}).get("torch"),
        **projection.as_dict(),
    }
    warning = None
    if target is not None and target.split(":")[0] != pilot_device.split(":")[0]:
        warning = (
            f"the pilot ran on {pilot_device}, this sheet is for {target}: its times and "
            "memory are not measurements of that device"
        )
        header["warning"] = warning
    table = sizing.phase_table(latest)
    if output_format == "json":
        click.echo(json.dumps({**header, "phases": table}, indent=2, default=str))
    else:
        click.echo(render([{"item": k, "value": v} for k, v in header.items()], output_format))
        click.echo("")
        click.echo(render(table, output_format))
    if warning:
        click.echo(f"campaign: warning: {warning}", err=True)


def _latest_pilot_environment(ledger: Any, campaign: str) -> dict[str, Any] | None:
    pilots = ledger.pilots(campaign)
    return None if pilots.empty else pilots["environment"].iloc[-1]


@click.command()
@click.option(
    "--stale-after",
    default=600,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds without a heartbeat after which a running run is declared lost.",
)
@click.option("--dry-run", is_flag=True, help="List heartbeat-stale runs without marking them.")
@output_options
@click.pass_obj
def doctor(source: Any, stale_after: float, dry_run: bool, output_format: str) -> None:
    """The software stack, the ledger's revision, and runs whose heartbeat stopped.

    Running runs whose heartbeat is older than --stale-after (on the database's clock)
    are declared lost (stop cause heartbeat_lost, with an event); continue them with
    `campaign resume RUN_ID` or `campaign launch CAMPAIGN --resume-lost`.

    Example: campaign doctor --stale-after 120 --format json
    """
    from campaign.ledger.engine import parse_url

    state = migrate.describe(parse_url(source.url))
    stale: list[dict[str, Any]] = []
    if state["revision"] == state["head"]:
        with source.open() as ledger:
            if dry_run:
                now = pd.Timestamp(ledger.database_now())
                for name in ledger.campaigns()["name"]:
                    for run in ledger.runs(name, status="running").itertuples():
                        age = (now - run.heartbeat_at).total_seconds()
                        if pd.isna(run.heartbeat_at) or age > stale_after:
                            stale.append({"campaign": name, "run_id": run.run_id,
                                          "worker": run.worker, "silent_s": round(age, 1),
                                          "action": "would be declared lost"})  # fmt: skip
            else:
                names = dict(ledger.campaigns()[["id", "name"]].itertuples(index=False))
                stale = [
                    {"campaign": names.get(lost.campaign_id), "run_id": lost.run_id,
                     "worker": lost.worker, "silent_s": round(lost.silent_s, 1),
                     "action": "declared lost"}
                    for lost in ledger.mark_lost(stale_after)
                ]  # fmt: skip
    stack = environment("campaign.tasks.digits:build")
    stack.pop("task", None)
    stack.pop("git_revision", None)
    document = {"stack": stack, "ledger": state, "stale_runs": stale}
    if stale and not dry_run:
        click.echo(
            f"campaign: {len(stale)} run(s) declared lost; continue them with "
            "`campaign resume RUN_ID` or `campaign launch CAMPAIGN --resume-lost`",
            err=True,
        )
    if output_format == "json":
        click.echo(json.dumps(document, indent=2, default=str))
        return
    rows = [
        {"item": k, "value": v}
        for k, v in {**stack, **{f"ledger {k}": v for k, v in state.items()}}.items()
    ]
    click.echo(render(rows, output_format))
    click.echo("")
    click.echo(render(stale, output_format) if stale else "no running run without a heartbeat")
