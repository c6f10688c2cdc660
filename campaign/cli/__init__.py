"""The ``campaign`` command line: a lazy click group over one module per command group.

Commands parse, call one library function and print. A command's module is
imported only when that command runs (click's documented lazy-group pattern),
and the group's help is written from the table below without importing any of
them, so ``campaign --help`` and the commands that only read the ledger never
import torch.

Exit codes (docs/cli.md): each project error carries its own (``campaign.errors``): 0
success; 1 the checked thing failed; 2 bad usage or bad input; 3 ledger problem. Errors print
one line on stderr, never a traceback for a user mistake.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from campaign.cli.output import printable
from campaign.cli.source import (
    DEFAULT_URL,
    ENV_VAR,
    LedgerSource,
    add_ledger_option,
    empty_ledger,
)
from campaign.errors import ExitCode, exit_code_of

# name -> (module:attribute, one line of help). The help is repeated here so that the
# group's help lists every command without importing their modules.
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("campaign.cli.plan:plan", "Plan the campaign in SPEC: every (variant, seed) becomes a planned run."),
    "show": ("campaign.cli.show:show", "A campaign's question, spec hash and variants; or one run's full config."),
    "runs": ("campaign.cli.plan:runs", "List a campaign's runs: id, variant, seed, status, stop, lineage, flags."),
    "relaunch": ("campaign.cli.plan:relaunch", "Plan a new run from an ended one, with changes and a reason."),
    "withdraw": ("campaign.cli.plan:withdraw", "Withdraw a planned run that must never execute (with a reason)."),
    "note": ("campaign.cli.plan:note", "Add a timestamped note to a campaign."),
    "notes": ("campaign.cli.plan:notes", "List a campaign's notes."),
    "inspect": ("campaign.cli.pilot:inspect", "Examples as the loss sees them, a data summary and the data gate."),
    "pilot": ("campaign.cli.pilot:pilot", "Every phase of the loop, once per gate class not yet covered by a passing pilot."),
    "size": ("campaign.cli.pilot:size", "Per gate class: time per run, the rentals that fit, memory against a card."),
    "doctor": ("campaign.cli.pilot:doctor", "The stack, the ledger revision, stale runs; with CAMPAIGN, can this stack run it."),
    "launch": ("campaign.cli.launch:launch", "Execute a campaign's planned runs on workers that claim them."),
    "worker": ("campaign.cli.launch:worker", "Run one plain worker: claim runs of CAMPAIGN until none is left."),
    "status": ("campaign.cli.launch:status", "Where a campaign stands: done, running, left, ETA."),
    "run": ("campaign.cli.run:run", "Execute one planned run in this process (what a worker calls)."),
    "resume": ("campaign.cli.run:resume", "Continue an interrupted or lost run from its last verified checkpoint."),
    "curve": ("campaign.cli.show:curve", "One run's curves update by update (train/loss and the validation metric, or --key)."),
    "order": ("campaign.cli.run:order", "Which example ids each update of a run used, microbatch by microbatch."),
    "replay": ("campaign.cli.run:replay", "Reload a run's final artifact and replay the control inputs."),
    "export": ("campaign.cli.export:export", "A run's model as a folder transformers/PEFT (or safetensors) load, with a model card."),
    "report": ("campaign.cli.report:report", "The balance sheet: conclusion, flags, variants, every run on its line."),
    "archive": ("campaign.cli.report:archive", "Pack everything the campaign leaves into one .tar.gz with SHA-256s."),
    "reproduce": ("campaign.cli.reproduce:reproduce", "Re-execute a run from its campaign's archive alone and compare it bit for bit."),
    "verify-archive": ("campaign.cli.report:verify_archive_command", "Check every member of an archive against its manifest."),
    "init": ("campaign.cli.init:init", "Write a task skeleton and a spec (DIR/study_task.py, DIR/spec.toml) to start from."),
    "demo": ("campaign.cli.demo:demo", "The main job on the embedded SQLite ledger: plan, pilot, launch, report."),
    "serve": ("campaign.cli.serve:serve", "A read-only live dashboard over the ledger (127.0.0.1 by default)."),
    "tensorboard": ("campaign.cli.serve:tensorboard", "Write a campaign's curves as TensorBoard event files (--follow: live)."),
    "mirror": ("campaign.cli.mirror:mirror", "Copy a campaign's runs to an MLflow server (adds what is new; never reads back)."),
    "campaigns": ("campaign.cli.ledger:campaigns", "List the campaigns in the ledger with their number of runs."),
    "db": ("campaign.cli.ledger:db", "Ledger schema: show the revision, upgrade an older ledger."),
}
# Commands that never open the ledger: they do not take --ledger after their name.
WITHOUT_LEDGER = frozenset({"demo", "verify-archive", "init", "reproduce"})


class LazyGroup(click.Group):
    """Imports a command's module when the command is used; lists commands from ``COMMANDS``.

    Every command (and every subcommand of a nested group) also accepts the
    global ``--ledger`` after its name, so ``campaign status X --ledger URL``
    works like ``campaign --ledger URL status X``. Project errors become one
    stderr line and the contract's exit code.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module_name, _, attribute = COMMANDS[name][0].partition(":")
        __import__(module_name)
        command = getattr(sys.modules[module_name], attribute)
        if name not in WITHOUT_LEDGER:
            add_ledger_option(command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        """Click's own, except that bad usage is one stderr line too (``campaign launch:
        Invalid value for '--heartbeat-s': ...``, exit 2), like every other error here."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        refusal = _unusable_invocation(sys.argv[1:] if args is None else list(args))
        if refusal is not None:
            click.echo(f"campaign: {refusal}", err=True)
            sys.exit(ExitCode.BAD_INPUT)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as error:
            where = error.ctx.command_path if error.ctx is not None else "campaign"
            message = " ".join(error.format_message().split())
            click.echo(f"{where}: {message} (see --help)", err=True)
            sys.exit(error.exit_code)
        except click.ClickException as error:
            error.show()
            sys.exit(error.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as error:
            code = exit_code_of(error)
            if code is None:
                raise
            prefix = "ledger error: " if code == ExitCode.LEDGER else ""
            click.echo(f"campaign: {prefix}{printable(str(error))}", err=True)
            ctx.exit(code)


def _unusable_invocation(arguments: list[str]) -> str | None:
    """What makes this command line unusable before any command reads it: an argument that is
    not UTF-8 text (the ledger stores text; it was an encoding traceback later), or a closed
    standard output (Python gives it as None and click then prints nothing, exit 0)."""
    for index, argument in enumerate(arguments, start=1):
        try:
            argument.encode("utf-8")
        except UnicodeEncodeError:
            shown = ascii(argument.encode("utf-8", "surrogateescape"))
            return f"argument {index} ({shown}) is not UTF-8 text"
    if sys.stdout is None:
        return ("standard output is closed: nothing could be written (redirect it to a file "
                "or /dev/null)")
    return None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--ledger",
    "ledger_url",
    envvar=ENV_VAR,
    default=DEFAULT_URL,
    show_default=True,
    metavar="URL",
    help=f"Ledger database: sqlite:///PATH or postgresql://USER@HOST/DB (env {ENV_VAR}); "
    "also accepted after the subcommand.",
)
@click.version_option(package_name="campaign")
@click.pass_context
def main(ctx: click.Context, ledger_url: str) -> None:
    """Run PyTorch training-experiment campaigns with the discipline of a careful lab.

    Example: campaign --ledger sqlite:///campaign.db db current
    """
    if not ledger_url.strip():  # given, and empty: an unset variable (an empty CAMPAIGN_LEDGER
        empty_ledger("--ledger")  # is unset, as click reads every environment variable)
    ctx.obj = LedgerSource(ledger_url)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
