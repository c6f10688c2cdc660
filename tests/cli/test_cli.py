"""The command line: help everywhere, ledger selection, the installed console script."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from campaign.cli import main
from campaign.ledger import Ledger, migrate
from tests.support.helpers import plan_campaign


def _walk(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path under ``command``, through click's own listing (the top group is
    lazy: its ``commands`` dict is empty until a command is looked up)."""
    found = [path]
    if isinstance(command, click.Group):
        context = click.Context(command)
        for name in command.list_commands(context):
            found += _walk(command.get_command(context, name), (*path, name))
    return found


def test_every_command_has_help_with_an_example() -> None:
    runner, paths = CliRunner(), _walk(main)
    named = {path[0] for path in paths if path}  # the walk really reaches the commands
    assert {"plan", "run", "launch", "report", "db", "pilot", "serve", "withdraw"} <= named
    assert ("db", "upgrade") in paths and len(paths) >= 30, paths
    for path in paths:
        result = runner.invoke(main, [*path, "--help"])
        assert result.exit_code == 0, path
        named = " ".join(path) or "campaign"
        assert re.search(r"Examples?: campaign", result.output), f"{named} lacks one"


def test_ledger_from_option_then_environment_then_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    option_db, env_db = tmp_path / "option.db", tmp_path / "env.db"
    with Ledger.open(f"sqlite:///{env_db}", create=True) as ledger:
        plan_campaign(ledger, name="from-env", seeds=1)
    with Ledger.open(f"sqlite:///{option_db}", create=True) as ledger:
        plan_campaign(ledger, name="from-option", seeds=1)
    env = {"CAMPAIGN_LEDGER": f"sqlite:///{env_db}"}
    by_env = runner.invoke(main, ["campaigns", "--format", "json"], env=env)
    assert [c["name"] for c in json.loads(by_env.stdout)] == ["from-env"]
    by_option = runner.invoke(
        main, ["--ledger", f"sqlite:///{option_db}", "campaigns", "--format", "json"], env=env
    )
    assert [c["name"] for c in json.loads(by_option.stdout)] == ["from-option"]
    monkeypatch.chdir(tmp_path)
    default = runner.invoke(main, ["campaigns"], env={"CAMPAIGN_LEDGER": ""})
    # The default ledger is campaign.db here; a command that only reads never creates it.
    assert default.exit_code == 3
    assert default.stderr.strip() == f"campaign: ledger error: no ledger at {Path('campaign.db')}"
    assert not (tmp_path / "campaign.db").exists()


def test_campaign_listing_formats(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger.open(url, create=True) as ledger:
        plan_campaign(ledger, seeds=3)
    runner = CliRunner()
    table = runner.invoke(main, ["--ledger", url, "campaigns"])
    assert table.stdout.splitlines()[0].split() == [
        "name",
        "runs",
        "task",
        "created_at",
        "question",
    ]
    assert "digits-lr" in table.stdout and " 9 " in table.stdout
    csv = runner.invoke(main, ["--ledger", url, "campaigns", "--format", "csv"])
    assert csv.stdout.startswith("name,runs,task,created_at,question\ndigits-lr,9,")
    doc = json.loads(runner.invoke(main, ["--ledger", url, "campaigns", "--format", "json"]).stdout)
    assert doc[0]["runs"] == 9 and doc[0]["name"] == "digits-lr"


def test_installed_console_script_in_a_subprocess(tmp_path: Path) -> None:
    script = shutil.which("campaign")
    assert script, "the campaign console script is not installed"
    url = f"sqlite:///{tmp_path / 'sub.db'}"
    env = {**os.environ, "CAMPAIGN_LEDGER": url}
    upgrade = subprocess.run([script, "db", "upgrade"], capture_output=True, text=True, env=env)
    assert upgrade.returncode == 0, upgrade.stderr
    assert upgrade.stdout == "" and "upgraded from empty to" in upgrade.stderr
    current = subprocess.run([script, "db", "current", "--format", "json"], capture_output=True,
                             text=True, env=env)
    assert json.loads(current.stdout)["revision"] == migrate.head_revision()
