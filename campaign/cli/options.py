"""Options shared by several commands (sqlite-utils' habit: option groups as decorators)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

ARTIFACTS_ENV = "CAMPAIGN_ARTIFACTS"


def artifacts_option(command: Any) -> Any:
    """``--artifacts DIR``: where checkpoints, predictions and final artifacts go."""
    return click.option(
        "--artifacts",
        type=click.Path(file_okay=False, path_type=Path),
        default=lambda: os.environ.get(ARTIFACTS_ENV, "campaign-artifacts"),
        show_default="campaign-artifacts (env CAMPAIGN_ARTIFACTS)",
        help="Folder for checkpoints, predictions and final artifacts.",
    )(command)


def device_option(command: Any) -> Any:
    """``--device``: the torch device a run or pilot uses."""
    return click.option(
        "--device", default="cpu", show_default=True, help="torch device: cpu, cuda, cuda:1 ..."
    )(command)
