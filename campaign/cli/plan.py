"""Planning commands: plan, runs, relaunch, withdraw, note, notes (thin: parse, call, print)."""

from __future__ import annotations

import json
from typing import Any

import click

from campaign.cli.output import output_options, render_rows
from campaign.cli.source import LedgerSource
from campaign.errors import LedgerInputError
from campaign.ledger.vocabulary import RUN_STATUSES


@click.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Validate and print the plan; write nothing.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a key of SPEC (TOML syntax, repeatable): a config key such as "
              "optimizer.lr=3e-4 (held if [hold] holds it, else the control's [config]), or "
              "SECTION.NAME such as grid.seeds=[0,1,2]; checked like the file's keys and "
              "frozen with the spec.")
@output_options
@click.pass_obj
def plan(source: LedgerSource, spec_path: str, dry_run: bool, sets: tuple[str, ...],
         output_format: str) -> None:
    """Plan the campaign in SPEC: every (variant, seed) becomes a planned run.

    Example: campaign plan lr-sweep.toml --set optimizer.lr=3e-4 --set campaign.name=lr-b
    """
    from campaign.host import client

    # The task host starts first (spawned, not waited for): its torch import overlaps this
    # command's own imports (the planner and the ledger's SQLAlchemy, 0.9 s) and reading and
    # validating the spec. A bad spec ends the command, and the host with it, at once.
    client.start_early()
    from campaign.errors import TaskContractError
    from campaign.host import calls
    from campaign.plan import grid as planning
    from campaign.plan.metric_names import metric_problem
    from campaign.plan.optimizer_check import raise_first
    from campaign.plan.overrides import named
    from campaign.plan.spec import SpecError, load_spec
    from campaign.plan.task_facts import task_facts
    from campaign.plan.task_keys import origin

    # The optimizer checks (torch's own) wait for the task's child to be under way.
    optimizers: list[Any] = []
    resolved = load_spec(spec_path, check_task=False, optimizers=optimizers, sets=sets)

    def refused(message: str) -> SpecError:  # naming the --set that put a key there
        return SpecError(named(message, spec_path, resolved.origins))

    # What planning asks the task, in one guarded child (the user's module imported once),
    # started first: it imports the task on one core while the optimizer checks run on the
    # other.
    pending = calls.begin(task_facts, resolved.task, resolved.control.config,
                          [v.config for v in resolved.variants] + [c for _, c in resolved.probes],
                          [v.name for v in resolved.variants] + [o for o, _ in resolved.probes],
                          task=resolved.task,
                          what="importing and building the task")
    try:
        raise_first(optimizers)
        facts = pending.result()
    except SpecError as error:
        raise refused(str(error)) from None
    except TaskContractError as error:
        raise refused(f"{spec_path}: campaign.task: {error}") from None
    finally:
        pending.cancel()
    if facts["reference"] is not None:
        raise refused(f"{spec_path}: campaign.task: {facts['reference']}")
    if facts.get("keys") is not None:
        key, message, index = facts["keys"]
        probe = int(index) - len(resolved.variants)  # one of the search space's ends
        where = (resolved.probes[probe][0] if probe >= 0
                 else origin(resolved.document, key))
        raise refused(f"{spec_path}: {where}: {message}")
    the_plan = planning.make_plan(resolved, sizes=facts["sizes"])
    if facts["contract"] is not None:  # before anything is written (a task without describe())
        raise refused(f"{spec_path}: campaign.task: {facts['contract']}")
    if facts.get("metrics") is not None:  # a metric the task never produces: no value, ever
        problem = metric_problem(resolved.document, facts["metrics"], facts.get("logged") or [])
        if problem is not None:
            raise refused(f"{spec_path}: {problem}")
    warnings = [*the_plan.warnings, *([facts["batch_stats"]] if facts.get("batch_stats") else [])]
    for warning in warnings:
        click.echo(f"campaign: warning: {warning}", err=True)
    run_ids: list[str | None] = [None] * len(the_plan.runs)
    created, pilot_only = False, False
    if dry_run:  # what the real plan would refuse, refused here too (nothing written)
        _refuse_like_the_plan(source, the_plan)
    else:
        with source.open(create=True) as ledger:
            before = _pilot_table(ledger, resolved.name)
            record, created = planning.record_plan(ledger, the_plan)
            if created and facts.get("layers"):  # what a relaunch is warned of (docs/runs.md)
                ledger.add_event(resolved.name, "batch_statistics", json.dumps(facts["layers"]))
            if created and sets:  # the frozen spec holds them merged; this says which they were
                ledger.add_event(resolved.name, "overrides", json.dumps(list(sets)))
            # the same question with other [pilot] settings (recorded), or back to its own
            pilot_only = not created and before != planning.current_pilot_table(ledger,
                                                                                record.name)
            run_ids = _run_ids_in_plan_order(ledger, record.name, the_plan)
    grid = [
        {"variant": v.name, "control": "yes" if v.is_control else "",
         "seeds": " ".join(map(str, resolved.seeds)),
         "sets": ", ".join(f"{k}={v!r}" for k, v in v.overrides.items())}
        for v in resolved.variants
    ]
    accounting = planning.accounting_rows(the_plan)
    run_rows = [{"run_id": rid, "variant": r.variant, "seed": r.seed,
                 "config_sha256": r.config_sha256[:16]}
                for rid, r in zip(run_ids, the_plan.runs, strict=True)]
    document = {
        "campaign": resolved.name, "question": resolved.question, "task": resolved.task,
        "spec_sha256": resolved.sha256, "sets": list(sets), "dry_run": dry_run,
        "created": created,
        "control": resolved.control.name, "variants": grid, "accounting": accounting,
        "runs": [{**row, "config_sha256": r.config_sha256}
                 for row, r in zip(run_rows, the_plan.runs, strict=True)],
        "warnings": warnings,
        "search": search_words(resolved.document),
    }
    if output_format == "json":
        click.echo(json.dumps(document, indent=2))
    elif output_format == "csv":  # one parseable table: a run per row, its variant's columns
        by_variant = {v["variant"]: v for v in grid}
        counted = {a["variant"]: a for a in accounting}
        click.echo(render_rows([
            {**row, "config_sha256": r.config_sha256, "control": by_variant[r.variant]["control"],
             "sets": by_variant[r.variant]["sets"],
             **{k: v for k, v in counted[r.variant].items() if k != "variant"}}
            for row, r in zip(run_rows, the_plan.runs, strict=True)], "csv"))
    else:
        for rows in (grid, accounting, run_rows):
            click.echo(render_rows(rows, output_format))
            click.echo("")
    count = (
        f"{len(resolved.variants)} variants x {len(resolved.seeds)} seeds = {len(run_rows)} runs"
    )
    if document["search"] is not None:
        click.echo(f"campaign: {document['search']['summary']}", err=True)
    if dry_run:
        click.echo(f"campaign: dry run of {resolved.name!r}: {count}; nothing written", err=True)
    elif created:
        click.echo(f"campaign: planned {resolved.name!r}: {count}", err=True)
    elif pilot_only:
        click.echo(f"campaign: {resolved.name!r} is already planned; its [pilot] settings "
                   "changed: recorded, the next pilot uses them (runs unchanged)", err=True)
    else:
        click.echo(f"campaign: {resolved.name!r} is already planned with this identical spec; "
                   "nothing written", err=True)


def _refuse_like_the_plan(source: LedgerSource, the_plan: Any) -> None:
    """A dry run against a ledger that already holds the name: the same-question check. A
    dry run needs no ledger: none, an empty or an unreachable one checks nothing more."""
    from campaign.errors import LedgerError
    from campaign.ledger import NotFound
    from campaign.plan.grid import refuse_another_question

    try:
        with source.open() as ledger:
            existing = ledger.campaign(the_plan.spec.name)
    except (LedgerError, NotFound):
        return
    refuse_another_question(existing, the_plan)


def _pilot_table(ledger: Any, name: str) -> dict[str, Any] | None:
    """The [pilot] table in force for campaign ``name``; None when it is not planned yet."""
    from campaign.ledger import NotFound
    from campaign.plan.grid import current_pilot_table

    try:
        return current_pilot_table(ledger, name)
    except NotFound:
        return None


def _run_ids_in_plan_order(ledger: Any, name: str, the_plan: Any) -> list[str | None]:
    frame = ledger.runs(name)
    originals = frame[frame["relaunch_of"].isna()]
    by_key = {(r.variant, int(r.seed)): r.run_id for r in originals.itertuples()}
    return [by_key.get((r.variant, r.seed)) for r in the_plan.runs]


@click.command()
@click.argument("campaign")
@click.option("--status", "statuses", multiple=True, type=click.Choice(RUN_STATUSES),
              help="Only runs in this status (repeatable).")
@output_options
@click.pass_obj
def runs(
    source: LedgerSource, campaign: str, statuses: tuple[str, ...], output_format: str
) -> None:
    """List the runs of a campaign: relaunches, deviations from the plan and integrity flags
    included (`campaign report` gives each flag's evidence).

    Example: campaign runs digits-lr --status diverged --format csv
    """
    from campaign.plan.config_keys import held_deviations
    from campaign.report.flags import campaign_flags

    with source.open() as ledger:
        record = ledger.campaign(campaign)
        listed = ledger.run_rows(campaign, status=list(statuses) or None)
        flags = campaign_flags(ledger, campaign)
    kinds = flags.groupby("run_id")["kind"].agg(lambda k: ", ".join(dict.fromkeys(k))).to_dict()
    hold = record.spec_document.get("hold", {})
    rows = [
        {"run_id": r["run_id"], "variant": r["variant"], "seed": r["seed"],
         "status": r["status"], "stop_cause": r["stop_cause"], "stop_step": r["stop_step"],
         "relaunch_of": r["relaunch_of"],
         "deviation": ", ".join(held_deviations(r["config"], hold)) or None,
         "flags": kinds.get(r["run_id"]), "detail": r["stop_detail"]}
        for r in listed
    ]
    columns = ("run_id", "variant", "seed", "status", "stop_cause", "stop_step", "relaunch_of",
               "deviation", "flags", "detail")
    click.echo(render_rows(rows, output_format, columns=columns))


@click.command()
@click.argument("run_id")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="A dotted config key and its new value (TOML syntax); repeatable.")
@click.option("--reason", required=True, help="Why the run is relaunched (recorded).")
@output_options
@click.pass_obj
def relaunch(source: LedgerSource, run_id: str, sets: tuple[str, ...], reason: str,
             output_format: str) -> None:
    """Plan a new run (new id) that repeats RUN_ID with changes; the old run stays as it is.

    Example: campaign relaunch 01jd... --set validation.microbatch=4 --reason "OOM in validation"
    """
    from campaign.ledger.vocabulary import paused_at_rung
    from campaign.loop.batch_stats import relaunch_warning
    from campaign.plan import grid as planning
    from campaign.plan.config_keys import config_changes
    from campaign.plan.overrides import parse_set
    from campaign.report.relaunches import defining_keys

    parsed = [parse_set(item) for item in sets]
    sets_given = dict(parsed)
    if len(sets_given) < len(parsed):  # the same key twice: which one was meant?
        twice = next(k for k, _ in parsed if sum(key == k for key, _ in parsed) > 1)
        raise LedgerInputError(f"--set {twice}: given more than once")
    if not reason.strip():
        raise LedgerInputError("--reason must say why the run is relaunched")
    with source.open() as ledger:
        old = ledger.run(run_id)
        if paused_at_rung(old.status, old.stop_detail):  # its rung's decision is still to come
            raise LedgerInputError(
                f"run {run_id} is paused at rung {old.stop_step} of its search: the rung's "
                f"decision continues or prunes it (`campaign launch {old.campaign}`); "
                "relaunch it once it has ended")
        hold = ledger.campaign(old.campaign).spec_document.get("hold", {})
        config, deviations = planning.relaunch_config(old.config_document, sets_given, hold)
        full_reason = reason + (f" [deviation: changes held {', '.join(deviations)}]"
                                if deviations else "")
        new_id = ledger.add_run(old.campaign, old.variant, old.seed, config,
                                relaunch_of=run_id, reason=full_reason)
        variant_keys = defining_keys(ledger.runs(old.campaign))
        layers = _batch_statistics(ledger, old.campaign)
    changes = config_changes(old.config_document, config)  # what really differs, derived keys too
    document = {"run_id": new_id, "relaunch_of": run_id, "variant": old.variant,
                "seed": old.seed, "changes": changes, "deviation": deviations}
    row = {**document, "deviation": ", ".join(deviations) or None,
           "changes": ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changes.items())
           or "none (an identical config: a rerun)"}
    click.echo(render_rows([row], output_format, document=document))
    if deviations:
        click.echo(f"campaign: warning: relaunch changes held {', '.join(deviations)}: "
                   "the report marks it as a deviation from the plan", err=True)
    if not changes and old.status == "diverged":
        click.echo(f"campaign: warning: run {run_id} diverged and this relaunch repeats its "
                   "identical config and seed: expect the same divergence (change something, "
                   "or say in --reason why a rerun may differ)", err=True)
    inexact = relaunch_warning(layers, old.config_document, config)
    if inexact:
        click.echo(f"campaign: warning: {inexact}", err=True)
    crossing = sorted(k for k in changes if k in variant_keys)
    if crossing:
        click.echo(f"campaign: warning: relaunch changes {', '.join(crossing)}, which tells the "
                   f"variants apart: it is no longer a run of {old.variant} (the report flags "
                   "it changes_variant_key and never pools it)", err=True)


@click.command()
@click.argument("run_ids", nargs=-1)
@click.option("--reason", required=True, help="Why the runs will never execute (recorded).")
@click.option("--campaign", "campaign_name", default=None,
              help="With --variant: the campaign whose variant's planned runs go.")
@click.option("--variant", default=None,
              help="Every planned run of this variant of --campaign (with the RUN_IDs given).")
@click.pass_obj
def withdraw(source: LedgerSource, run_ids: tuple[str, ...], reason: str,
             campaign_name: str | None, variant: str | None) -> None:
    """Withdraw planned runs that must never execute (planned by mistake).

    Each keeps its line everywhere with status withdrawn and the reason, is never
    claimed and counts in no statistic. A run that started cannot be withdrawn: then
    none of those named is (every run is checked first).

    Example: campaign withdraw 01jd... 01je... --reason "microbatch 3 without accumulation 4"
    """
    if not reason.strip():
        raise LedgerInputError("--reason must say why the run is withdrawn")
    if (campaign_name is None) != (variant is None):
        raise LedgerInputError("--variant and --campaign go together (a variant's name is "
                               "its campaign's)")
    with source.open() as ledger:
        chosen = list(dict.fromkeys(run_ids))
        if variant is not None and campaign_name is not None:
            runs = ledger.runs(campaign_name)
            if variant not in set(runs["variant"]):
                raise LedgerInputError(f"campaign {campaign_name!r} has no variant {variant!r}")
            mine = runs[(runs["variant"] == variant) & (runs["status"] == "planned")]
            chosen += [r for r in mine["run_id"] if r not in chosen]
        if not chosen:
            raise LedgerInputError("no run to withdraw: name RUN_IDs or --campaign/--variant")
        for run_id in chosen:  # all or none: a started run refuses the whole command
            status = ledger.run(run_id).status
            if status != "planned":
                raise LedgerInputError(f"run {run_id} is {status}: only a planned run can be "
                                       "withdrawn (nothing was withdrawn)")
        for run_id in chosen:
            ledger.withdraw(run_id, reason)
    for run_id in chosen:
        click.echo(f"campaign: run {run_id} withdrawn: {reason.strip()}", err=True)


@click.command()
@click.argument("campaign")
@click.argument("text")
@click.pass_obj
def note(source: LedgerSource, campaign: str, text: str) -> None:
    """Add a timestamped note (a decision, an observation) to a campaign.

    Example: campaign note digits-lr "control kept: 2e-4 diverged on seed 1"
    """
    with source.open() as ledger:
        ledger.add_note(campaign, text)
    click.echo(f"campaign: note added to {campaign!r}", err=True)


@click.command()
@click.argument("campaign")
@output_options
@click.pass_obj
def notes(source: LedgerSource, campaign: str, output_format: str) -> None:
    """List a campaign's notes, oldest first.

    Example: campaign notes digits-lr --format json
    """
    with source.open() as ledger:
        frame = ledger.notes(campaign)
    rows = [{"at": r.at.isoformat(), "text": r.text} for r in frame.itertuples()]
    click.echo(render_rows(rows, output_format))


def _batch_statistics(ledger: Any, campaign: str) -> list[str]:
    """The batch-statistics layers ``plan`` found in the campaign's model (an event), or []."""
    events = ledger.events(campaign)
    found = events[events["kind"] == "batch_statistics"]["detail"]
    try:
        layers = json.loads(found.iloc[-1]) if len(found) else []
    except ValueError:
        return []
    return [str(layer) for layer in layers] if isinstance(layers, list) else []


def search_words(document: dict[str, Any]) -> dict[str, Any] | None:
    """A search's settings as the plan shows them (docs/search.md), or None for a grid."""
    from campaign.plan.search_spec import search_plan

    plan = search_plan(document)
    if plan is None:
        return None
    parts = [f"search: {plan.method}"]
    if plan.sampler:
        parts.append(f"{plan.trials} {plan.sampler} proposals in cohorts of {plan.cohort}")
    if plan.halving:
        parts.append(f"rungs {', '.join(map(str, plan.rungs))}, keep {plan.keep:g} "
                     f"({plan.rule}), audit {plan.audit:g}")
    if plan.confirm:
        parts.append(f"the {plan.confirm} best confirmed on seeds "
                     f"{', '.join(map(str, plan.confirm_seeds))}")
    parts.append("these runs are the control's and the grid's: the search plans the rest as "
                 "it goes")
    return {"method": plan.method, "sampler": plan.sampler, "trials": plan.trials or None,
            "cohort": plan.cohort if plan.sampler else None, "rungs": list(plan.rungs),
            "keep": plan.keep if plan.halving else None, "rule": plan.rule,
            "audit": plan.audit, "confirm": plan.confirm,
            "confirm_seeds": list(plan.confirm_seeds), "summary": "; ".join(parts)}
