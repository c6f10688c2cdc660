"""Pilot commands (thin): inspect, pilot, size, doctor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from campaign.cli.options import FiniteRange, artifacts_option, device_option, seconds
from campaign.cli.output import output_options, printable, render_rows
from campaign.cli.source import LedgerSource

PILOT_TIMEOUT_S = 24 * 3600.0  # the pilot trains (the overfit gate): no plan-time limit


@click.command()
@click.argument("campaign")
@click.option("--n", "count", default=4, show_default=True, help="How many examples to show.")
@click.option("--split", default="train", show_default=True,
              help="Any split the task has: train, val, and test when it has one.")
@artifacts_option
@output_options
@click.pass_obj
def inspect(
    source: LedgerSource, campaign: str, count: int, split: str, artifacts: Path,
    output_format: str,
) -> None:
    """Show examples as the loss receives them, a summary of the split, and the data gate.

    Uses the control's config. Exit code 1 when the data gate fails.

    Example: campaign inspect digits-lr --n 4 --split val
    """
    from campaign.host import client

    client.start_early()  # the task's calls fork from it: torch imports while the ledger opens
    from campaign.loop.run_files import artifacts_environment
    from campaign.pilot.inspect_hosted import inspect_campaign

    with source.open() as ledger, artifacts_environment(artifacts):  # a task's caches
        document = inspect_campaign(ledger, campaign, split, count)
    if output_format == "json":
        click.echo(json.dumps(document, indent=2, default=str))
    else:
        seen = {str(row["id"]): row for row in document.get("loss_view", [])}
        for example in document["examples"]:
            click.echo(f"--- {example['id']}")
            for key, value in example.items():
                if key != "id":
                    text = "\n".join(printable(line) for line in str(value).split("\n"))
                    click.echo(f"{key}:" + (f"\n{text}" if "\n" in text else f" {text}"))
            collated = seen.get(str(example["id"]), {})
            if collated:  # the same example as the loss receives it (its collated row)
                click.echo("as the loss receives it (collate):")
                for key, value in collated.items():
                    if key != "id":
                        click.echo(f"  {key}: {printable(str(value))}")
        summary = [{"summary": k, "value": v} for k, v in document["summary"].items()]
        click.echo("")
        click.echo(render_rows(summary, output_format))
        click.echo("")
        click.echo(render_rows(document["data_gate"], output_format))
    if not document["passed"]:
        failed = ", ".join(g["check"] for g in document["data_gate"] if g["verdict"] != "pass")
        click.echo(f"campaign: data gate failed ({failed})", err=True)
        raise click.exceptions.Exit(1)


@click.command()
@click.argument("campaign")
@artifacts_option
@device_option
@click.option(
    "--overfit-examples",
    default=None,
    type=click.IntRange(2),
    help="Training examples the overfit gate must learn (default: the spec's [pilot], 8).",
)
@click.option(
    "--overfit-steps",
    default=None,
    type=click.IntRange(1),
    help="Updates the overfit gate may take (default: the spec's [pilot], 60).",
)
@click.option(
    "--overfit-factor",
    default=None,
    type=FiniteRange(1, 1e6),
    help="By how much the overfit loss must fall (default: the spec's [pilot], 5).",
)
@click.option("--class", "only", metavar="ID",
              help="Pilot this gate class (its id or a prefix), even when it is covered.")
@click.option("--all", "every", is_flag=True,
              help="Pilot every gate class that could run again (after a stack change).")
@output_options
@click.pass_obj
def pilot(source: LedgerSource, campaign: str, artifacts: Path, device: str,
          overfit_examples: int, overfit_steps: int, overfit_factor: float, only: str | None,
          every: bool, output_format: str) -> None:
    """One recorded pass through every phase per gate class; exit 1 when one fails.

    Runs that differ only in free keys (a learning rate, a seed) share a gate class;
    a wider model or another max_length is another class. Pilots every class that
    could run and has no passing pilot yet.

    Example: campaign pilot digits-lr --device cpu
    """
    from campaign.host import calls, client
    from campaign.pilot import pilot_entries

    client.start_early(calls.CHECK_PRELOAD)  # torch imports while this process reads the ledger
    overrides = {"overfit_examples": overfit_examples, "overfit_steps": overfit_steps,
                 "overfit_factor": overfit_factor}  # None: the spec's [pilot] table decides
    with source.open() as ledger:  # a missing ledger or campaign ends here, nothing started
        task = ledger.campaign(campaign).task
        url = ledger.engine.url.render_as_string(hide_password=False)
    # The pilot computes: in a child of the task host, whose own children are its
    # fresh-process checks (no time limit of a plan-time call: it trains).
    pilots = calls.call(pilot_entries.pilot_documents, url, campaign,
                        str(artifacts), device, overrides, only, every, task=task,
                        preload=calls.CHECK_PRELOAD,
                        what=f"piloting {campaign!r}", timeout_s=PILOT_TIMEOUT_S)
    if not pilots:
        click.echo(f"campaign: every gate class of {campaign!r} that could run has a passing "
                   "pilot (--all pilots them again)", err=True)
        if output_format == "json":
            click.echo(json.dumps({"campaign": campaign, "passed": True, "pilots": []}))
        return
    rows = [phase for p in pilots for phase in p["phases"]]
    passed = all(p["passed"] for p in pilots)
    document = {"campaign": campaign, "passed": passed, "pilots": pilots}
    click.echo(render_rows(rows, output_format, document=document))
    for p in pilots:
        verdict = "passed" if p["passed"] else "FAILED"
        click.echo(f"campaign: {p['label']} of {campaign!r}, gate class "
                   f"{p['gate_class']} (variant {p['variant']}) {verdict}", err=True)
    if not passed:
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
    type=FiniteRange(0, 10),
    help="Evaluation/export reserve, as a fraction of the compute time.",
)
@click.option("--gpu-memory", default=None, metavar="SIZE",
              help="A card's memory (80GiB, 24GB): check each class's measured peaks against it, "
                   "and rent only that card in the strategy sheet.")
@click.option("--headroom", default=0.1, show_default=True, type=FiniteRange(0, 0.9),
              help="Share of each device's memory left free when choosing a rental.")
@click.option("--model-config", "model_config", multiple=True, metavar="KEY=VALUE",
              help="A causal LM campaign: project the memory of a larger model of the same "
                   "family with these sizes (repeat: hidden_size=2048 num_hidden_layers=24).")
@output_options
@click.pass_obj
def size(source: LedgerSource, campaign: str, target: str | None, reserve: float,
         gpu_memory: str | None, headroom: float, model_config: tuple[str, ...],
         output_format: str) -> None:
    """The sizing sheet per gate class: time per run (median phase times plus fixed costs),
    the runs in priority order that fit a 3-, 7- or 30-day rental, memory against a card.

    Example: campaign size digits-lr --reserve 0.25 --gpu-memory 80GiB
    """
    from campaign.errors import BadInput
    from campaign.pilot.sizing import parse_memory, sizing_sheet
    from campaign.pilot.strategies import ASSUMPTIONS as STRATEGY_ASSUMPTIONS
    from campaign.pilot.strategies import strategy_table

    try:
        card = None if gpu_memory is None else parse_memory(gpu_memory)
    except ValueError as error:
        raise BadInput(f"--gpu-memory: {error}") from None  # one line, exit 2
    with source.open() as ledger:
        sheet = sizing_sheet(ledger, campaign, target=target, reserve=reserve, gpu_memory=card,
                             headroom=headroom)
        projected = (_projection(ledger, campaign, model_config, headroom, card)
                     if model_config else None)
    if output_format == "json":
        document = sheet.document()
        if projected is not None:
            document["memory_projection"] = projected
        click.echo(json.dumps(document, indent=2, default=str))
    else:
        header = [{"item": k, "value": v} for k, v in sheet.header.items()]
        for rows in (header, sheet.classes, sheet.packages, sheet.phases):
            click.echo(render_rows(rows, output_format))
            click.echo("")
        if sheet.strategies:  # memory per device by strategy and ranks, and the rental
            click.echo(render_rows(strategy_table(sheet.strategies), output_format))
            click.echo(f"strategies: {STRATEGY_ASSUMPTIONS}\n")
        for found in (projected or {}).get("classes", []):
            click.echo(f"memory projection, gate class {found['gate_class']} "
                       f"({found.get('adapter', '?')}): {found.get('note', '')}")
            if found["rows"]:
                click.echo(render_rows(found["rows"], output_format))
                click.echo("")
                click.echo(render_rows(strategy_table(found["strategies"]), output_format))
                click.echo("smallest rental: " + ", ".join(
                    f"{k} {v or 'none fits'}" for k, v in found["rentals"].items()))
            click.echo("")
        if projected:
            click.echo(f"memory projection: {projected['assumptions']}")
    if sheet.warning:
        click.echo(f"campaign: warning: {sheet.warning}", err=True)


def _projection(ledger: Any, campaign: str, pairs: tuple[str, ...], headroom: float,
                card: int | None) -> dict[str, Any]:
    from campaign.errors import BadInput

    try:
        from campaign.pilot.larger_model import project_campaign
        from campaign.tasks.causal_lm.memory_projection import parse_overrides

        return project_campaign(ledger, campaign, parse_overrides(pairs), headroom, card)
    except ImportError as error:
        raise BadInput(f"--model-config needs the hf extra ({error.name}): "
                       "pip install 'campaign[hf]'") from None
    except ValueError as error:
        raise BadInput(str(error)) from None


@click.command()
@click.option(
    "--stale-after",
    default=600,
    show_default=True,
    type=seconds(0.1),
    help="Seconds without a heartbeat after which a running run is declared lost.",
)
@click.option("--dry-run", is_flag=True, help="List heartbeat-stale runs without marking them.")
@click.argument("campaign", required=False)
@click.option("--device", default="cpu", show_default=True,
              help="With CAMPAIGN: the device its runs would use here.")
@output_options
@click.pass_obj
def doctor(source: LedgerSource, stale_after: float, dry_run: bool, campaign: str | None,
           device: str, output_format: str) -> None:
    """The software stack, the ledger's revision, and runs whose heartbeat stopped; with
    CAMPAIGN, whether this stack can run it (its task's declared requirements, each
    precision its runs use on --device). Exit 1 when it cannot.

    Running runs whose heartbeat is older than --stale-after (on the database's clock)
    are declared lost (stop cause heartbeat_lost, with an event); continue them with
    `campaign resume RUN_ID` or `campaign launch CAMPAIGN --resume-lost`.

    Example: campaign doctor --stale-after 120 --format json
    """
    from campaign.gates.doctor import examine

    document = examine(source.url, stale_after_s=stale_after, dry_run=dry_run)
    unfit: list[str] = []
    if campaign is not None:
        from campaign.errors import StackRefused
        from campaign.launch.worker import refuse_unfit_stack

        with source.open() as ledger:
            try:
                refuse_unfit_stack(ledger, campaign, device)
            except StackRefused as refused:
                unfit = [str(refused)]
        document["campaign"] = {"name": campaign, "device": device, "fit": not unfit,
                                "problems": unfit}
    stale = document["stale_runs"]
    if stale and not dry_run:
        click.echo(
            f"campaign: {len(stale)} run(s) declared lost; continue them with "
            "`campaign resume RUN_ID` or `campaign launch CAMPAIGN --resume-lost`",
            err=True,
        )
    corrupted = document["ledger"]["integrity"] != "ok"
    if corrupted:
        click.echo(f"campaign: the ledger is damaged: {document['ledger']['integrity']}", err=True)
    if output_format == "json":
        click.echo(json.dumps(document, indent=2, default=str))
        if unfit or corrupted:
            raise click.exceptions.Exit(1)
        return
    items = {**document["stack"], **{k if k == "ledger" else f"ledger {k}": v
                                     for k, v in document["ledger"].items()}}
    click.echo(render_rows([{"item": k, "value": v} for k, v in items.items()], output_format))
    click.echo("")
    click.echo(render_rows(stale, output_format) if stale else "no running run without a heartbeat")
    if campaign is not None:
        click.echo("")
        click.echo(f"campaign {campaign!r} on {device}: "
                   + ("this stack can run it" if not unfit else unfit[0]))
    if unfit or corrupted:
        raise click.exceptions.Exit(1)
