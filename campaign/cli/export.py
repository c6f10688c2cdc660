"""``campaign export RUN_ID --to DIR``: a run's model as a folder other tools load (thin)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from campaign.cli.output import output_options
from campaign.cli.source import LedgerSource

EXPORT_TIMEOUT_S = 3600.0  # rebuilding and saving a model, in a child of the task host


@click.command()
@click.argument("run_id")
@click.option("--to", "target", required=True, type=click.Path(path_type=Path),
              help="The folder to create (it must not exist, or be empty).")
@click.option("--merge", is_flag=True,
              help="A LoRA run: merge the adapter into the base (a plain model folder).")
@output_options
@click.pass_obj
def export(source: LedgerSource, run_id: str, target: Path, merge: bool,
           output_format: str) -> None:
    """Export a run's final artifact (its SHA-256 checked first) as a folder: for a causal LM
    or a Hugging Face classifier one that transformers' from_pretrained (AutoModelForCausalLM,
    AutoModelForSequenceClassification; PEFT's PeftModel.from_pretrained, for an adapter)
    loads, with its tokenizer; for any other task
    model.safetensors and config.json. A model card (README.md: the question, the campaign's
    conclusion, this run, its value, flags and hashes) and a MANIFEST.json go with it. The
    ledger's own files are never written to.

    Example: campaign export 01jd8x3m5k2q9w7c4v6b1n0r8t --to exported/lr-3e-2-seed-0
    """
    from campaign.errors import BadInput
    from campaign.host import calls
    from campaign.loop import loop_entries
    from campaign.report.model_card import model_card

    if target.is_symlink() or target.is_file() or (target.is_dir() and any(target.iterdir())):
        raise BadInput(f"--to {target}: exists and is not an empty folder (export makes a new "
                       "one: name another)")
    if not target.absolute().parent.is_dir():
        raise BadInput(f"--to {target}: its parent folder does not exist")
    with source.open() as ledger:  # a missing ledger or run id ends here, nothing started
        record = ledger.run(run_id)
        if record.status not in ("completed", "stopped"):
            raise BadInput(f"run {run_id} is {record.status}: only a completed or stopped run "
                           "has a final artifact to export")
        task = ledger.campaign(record.campaign).task
        card = model_card(ledger, run_id)
        url = ledger.engine.url.render_as_string(hide_password=False)
    emptied = target.is_dir()
    if emptied:
        target.rmdir()  # empty: the export renames its finished folder into this place
    try:
        done = calls.call(loop_entries.export_run, url, run_id, str(target), merge,
                          card, task=task, preload=calls.CHECK_PRELOAD,
                          what=f"exporting run {run_id}", timeout_s=EXPORT_TIMEOUT_S)
    except BaseException:
        if emptied:
            target.mkdir(exist_ok=True)  # the user's empty folder, as it was
        raise
    with source.open() as ledger:  # the lineage: which folder came from which artifact
        ledger.add_event(record.campaign, "exported",
                         f"run {run_id} -> {done['to']} ({done['format']}; final artifact "
                         f"{done['final_artifact_sha256'][:16]})")
    if output_format == "json":
        click.echo(json.dumps(done, indent=2))
    click.echo(f"campaign: run {run_id} exported to {done['to']} ({done['format']}, "
               f"{len(done['files'])} files)", err=True)
