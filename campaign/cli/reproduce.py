"""``campaign reproduce ARCHIVE``: re-execute a run from its archive alone and compare (thin)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import time
from pathlib import Path
from typing import Any

import click

from campaign.cli.output import output_options, printable
from campaign.errors import BadInput


@click.command()
@click.argument("archive", type=click.Path(path_type=Path))
@click.option("--run", "run_id", default=None,
              help="The run to reproduce (default: every completed or stopped run).")
@click.option("--dir", "folder", type=click.Path(path_type=Path), default=None,
              help="The new folder to work in (default ./reproduce-ARCHIVE; must not exist).")
@click.option("--trust-task-code", "trust", is_flag=True,
              help="Run the archive's code (its files and SHA-256 are printed first); a "
                   "built-in task placing no code is this installation's and needs no flag.")
@output_options
def reproduce(archive: Path, run_id: str | None, folder: Path | None, trust: bool,
              output_format: str) -> None:
    """Re-execute a run from a campaign archive alone, on the CPU, in a fresh folder and ledger,
    and compare its metrics bit for bit (timings aside) and its final weights by SHA-256.

    The archive is verified first; its task source, data and tokenizer are laid out as the run
    saw them and checked against the hashes the run recorded (data the run read from outside
    its working folder is placed below the new folder and its setting pointed there); nothing
    is written outside the new folder. The archive's code (every importable file it places,
    or a task that is not a built-in) runs only with --trust-task-code, after its files and
    their SHA-256 are printed. Exit code 0 when every run reproduces exactly, 1 when one
    differs or a piece is missing, changed or malformed (named), 2 for a bad argument or
    task code not trusted.

    Example: campaign reproduce digits-lr-archive.tar.gz --run 01jd8x3m5k2q9w7c4v6b1n0r8t
    """
    from campaign.report.archive_check import verify_archive
    from campaign.reproduce.rerun import reproduce as rerun
    from campaign.reproduce.unpack import ReproduceError

    folder = folder or Path(f"reproduce-{archive.name.removesuffix('.tar.gz')}")
    if folder.exists() or folder.is_symlink():
        raise BadInput(f"--dir {folder}: exists (reproduce works in a new folder: name another)")
    if not folder.absolute().parent.is_dir():
        raise BadInput(f"--dir {folder}: its parent folder does not exist")
    started = time.perf_counter()
    verify_archive(archive)  # unusable: exit 2; does not verify: exit 1 (campaign.errors)
    folder.mkdir()
    try:
        comparisons, moved = rerun(
            archive.absolute(), folder.absolute(), run_id, _invoke, trust=trust,
            say=lambda line: click.echo(f"campaign: {printable(line)}", err=True))
    except ReproduceError as error:  # nothing ran to compare: the new folder goes again
        shutil.rmtree(folder, ignore_errors=True)
        click.echo(f"campaign: {archive}: {printable(str(error))}", err=True)
        raise click.exceptions.Exit(error.exit_code) from None
    except BaseException:  # (a fault of ours, or Ctrl-C: nothing half made is left either)
        shutil.rmtree(folder, ignore_errors=True)
        raise
    rows = [{"run_id": c.original, "reproduced_as": c.reproduced, "status": c.status,
             "points": c.points, "metrics": "identical" if not c.differing else "differ",
             "weights": "identical" if c.weights_original == c.weights_reproduced else "differ",
             "first_difference": _first_difference(c)}
            for c in comparisons]
    if output_format == "json":
        click.echo(json.dumps({"archive": str(archive), "folder": str(folder), "runs": [
            {**row, "differences": c.differing, "environment_differences": c.environment,
             "weights_sha256": c.weights_original,
             "reproduced_weights_sha256": c.weights_reproduced}
            for row, c in zip(rows, comparisons, strict=True)]}, indent=2))
    else:
        from campaign.cli.output import render_rows

        click.echo(render_rows(rows, output_format))
    for setting, old, new in moved:
        click.echo(f"campaign: {setting} = {old!r} lay outside the run's working folder: "
                   f"placed at {new} and the setting pointed there", err=True)
    took = time.perf_counter() - started
    same = sum(c.identical for c in comparisons)
    click.echo(f"campaign: {same} of {len(comparisons)} runs reproduced bit for bit from "
               f"{archive} in {took:.1f} s (in {folder})", err=True)
    if same != len(comparisons):
        raise click.exceptions.Exit(1)


def _first_difference(comparison: Any) -> str:
    """The first differing metric, with what differs in the environment beside it."""
    if not comparison.differing:
        return ""
    causes = "; ".join(comparison.environment) or "the same recorded environment"
    return f"{comparison.differing[0]} ({causes})"


def _invoke(arguments: list[str], *, quiet: bool = False) -> None:
    """A command as a user types it, in this process; its failure is this one's, named."""
    from campaign.cli import main
    from campaign.reproduce.unpack import ReproduceError

    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out) if quiet else contextlib.nullcontext():
            code = main.main(arguments, standalone_mode=False)  # (returns ctx.exit's code)
    except click.exceptions.Exit as exit_:
        code = exit_.exit_code
    except click.ClickException as error:
        raise ReproduceError(f"campaign {arguments[2]}: {error.format_message()}") from None
    if isinstance(code, int) and code:
        raise ReproduceError(f"campaign {arguments[2]} exited {code} on the archive's inputs "
                             "(its message is above)")
