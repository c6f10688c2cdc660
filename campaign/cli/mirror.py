"""``campaign mirror``: a campaign's runs copied where a team already looks (thin: parse, call,
print)."""

from __future__ import annotations

import click

from campaign.cli.source import LedgerSource
from campaign.errors import BadInput


@click.command()
@click.argument("campaign_name", metavar="CAMPAIGN")
@click.option("--to", "target", type=click.Choice(["mlflow"]), required=True,
              help="Where to mirror (MLflow's own client).")
@click.option("--tracking-uri", required=True,
              help="The MLflow tracking server, http://HOST:PORT.")
@click.pass_obj
def mirror(source: LedgerSource, campaign_name: str, target: str, tracking_uri: str) -> None:
    """Copy CAMPAIGN's runs to an MLflow server: one experiment, one MLflow run per ledger run
    (tags: variant, seed, status, stop cause, lineage, run id), the config as params, every
    metric at its update, the report and model cards as artifacts. Run again, it adds what is
    new. The ledger stays the truth: nothing is read back. Needs: pip install 'campaign[mlflow]'.

    Example: campaign mirror digits-lr --to mlflow --tracking-uri http://mlflow.lab:5000
    """
    from campaign.ledger import LedgerReader

    try:
        import mlflow  # noqa: F401 - the extra's presence, said in one line

        from campaign.report.mlflow_mirror import mirror_to_mlflow
    except ImportError:
        raise BadInput("campaign mirror --to mlflow needs MLflow: "
                       "pip install 'campaign[mlflow]'") from None
    reader = LedgerReader.open(source.url)
    try:
        reader.campaign(campaign_name)  # an unknown campaign: one line before any server
        done = mirror_to_mlflow(reader, campaign_name, tracking_uri)
    finally:
        reader.close()
    click.echo(f"campaign: mirrored {done.runs} runs of {campaign_name!r} to {tracking_uri} "
               f"({done.new_runs} new, {done.updated} updated, {done.points} new points)",
               err=True)
