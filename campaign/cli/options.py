"""Options shared by several commands (sqlite-utils' habit: option groups as decorators)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import click

ARTIFACTS_ENV = "CAMPAIGN_ARTIFACTS"
LONGEST_S = 1e9  # about 31 years: past it a duration is a typo, and datetime overflows


class FiniteRange(click.FloatRange):
    """click's FloatRange without NaN (it compares false with either bound, so click lets it
    through) or an infinity: a number option is a finite number within its range."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def seconds(shortest: float, longest: float = LONGEST_S) -> FiniteRange:
    """A duration option's type: finite seconds in [shortest, longest]."""
    return FiniteRange(shortest, longest)


def artifacts_option(command: Any) -> Any:
    """``--artifacts DIR``: where checkpoints, predictions and final artifacts go."""
    return click.option(
        "--artifacts",
        type=click.Path(file_okay=False, path_type=Path),
        default=lambda: os.environ.get(ARTIFACTS_ENV, "campaign-artifacts"),
        show_default="campaign-artifacts (env CAMPAIGN_ARTIFACTS)",
        help="Folder for checkpoints, predictions and final artifacts.",
        callback=_a_folder_can_be_made,
    )(command)


def _a_folder_can_be_made(_ctx: click.Context, _param: click.Parameter, value: Path) -> Path:
    """Refused before anything is claimed: a folder under a file (its run was left
    ``running`` by a NotADirectoryError when it made its first folder)."""
    for above in (value, *value.absolute().parents):
        if above.exists() or above.is_symlink():
            if not above.is_dir():
                raise click.BadParameter(f"{value}: {above} is a file, not a folder")
            if not os.access(above, os.W_OK | os.X_OK):
                raise click.BadParameter(f"{value}: {above} cannot be written")
            return value
    return value


def device_option(command: Any) -> Any:
    """``--device``: the torch device a run or pilot uses."""
    return click.option(
        "--device", default="cpu", show_default=True, help="torch device: cpu, cuda, cuda:1 ..."
    )(command)


def skip_reason(skip_pilot: bool, reason: str | None) -> str | None:
    """The recorded reason to skip the pilot gate (None: the gate applies)."""
    if skip_pilot and not (reason and reason.strip()):
        raise click.UsageError("--skip-pilot needs --reason TEXT (it is recorded in the ledger)")
    if reason and not skip_pilot:
        raise click.UsageError("--reason goes with --skip-pilot")
    return reason if skip_pilot else None


def stop_grace_option(command: Any) -> Any:
    """``--stop-grace-s``: between a graceful signal to a supervised run and its kill."""
    return click.option(
        "--stop-grace-s", type=seconds(0.1), default=30.0, show_default=True,
        help="After a graceful signal to a run (wall time reached, SIGTERM), how long it "
        "gets to checkpoint and end before it is killed.",
    )(command)


def ranks_option(command: Any) -> Any:
    """``--ranks N``: the processes a resumed run continues on, when not its loop.replicas."""
    return click.option(
        "--ranks", type=click.IntRange(1, 4096), default=None,
        help="Resume runs on N ranks instead of their loop.replicas (fewer GPUs after a lost "
        "node): the effective batch is kept, a sharded checkpoint is resharded, and the run's "
        "`resharded` event records it. A run's first segment always takes its loop.replicas.",
    )(command)


def max_requeues_option(command: Any) -> Any:
    """``--max-requeues``: how often a SLURM array task requeues itself after a preemption."""
    return click.option(
        "--max-requeues", type=click.IntRange(0), default=3, show_default=True,
        help="slurm: how often one array task may requeue itself after a preemption.",
    )(command)
