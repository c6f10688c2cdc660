"""Commands that do not train never import torch (docs/cli.md): each reading command, and the
dashboard's every page kind, in a fresh interpreter that reports what it imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from campaign.cli import main

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "examples" / "digits-lr.toml"


READING_COMMANDS = [
    ["--help"],
    ["campaigns"],
    ["show", "digits-lr"],
    ["runs", "digits-lr", "--format", "json"],
    ["status", "digits-lr", "--format", "json"],
    ["notes", "digits-lr"],
    ["report", "digits-lr", "--format", "json", "--output", "-"],
    ["db", "current"],
    ["tensorboard", "digits-lr", "--logdir", "tb"],
]

PROBE = """
import json, sys
from campaign.cli import main
try:
    main(sys.argv[1:], prog_name="campaign")
except SystemExit as done:
    code = done.code
print(json.dumps({"torch": "torch" in sys.modules, "code": code}), file=sys.stderr)
"""


@pytest.mark.parametrize("arguments", READING_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_reading_commands_never_import_torch(tmp_path: Path, arguments: list[str]) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    planned = CliRunner().invoke(main, ["--ledger", url, "plan", str(SPEC)])
    assert planned.exit_code == 0, planned.output
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "--ledger", url, *arguments],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    verdict = json.loads(done.stderr.strip().splitlines()[-1])
    assert verdict["code"] in (0, None), done.stderr
    assert verdict["torch"] is False, f"`campaign {' '.join(arguments)}` imported torch"


def test_the_dashboard_renders_without_torch(tmp_path: Path) -> None:
    """`campaign serve` reads and renders every page kind without importing torch or
    matplotlib (its curves are drawn in the browser)."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    planned = CliRunner().invoke(main, ["--ledger", url, "plan", str(SPEC)])
    assert planned.exit_code == 0, planned.output
    probe = (
        "import sys, json\n"
        "from campaign.ledger import LedgerReader\n"
        "from campaign.serve import pages\n"
        "from campaign.serve.watch import Watcher\n"
        f"reader = LedgerReader.open({url!r})\n"
        "pages.campaigns_page(reader); pages.campaign_page(Watcher(reader), 'digits-lr')\n"
        "run = reader.runs('digits-lr')['run_id'][0]\n"
        "pages.run_page(reader, run); Watcher(reader).poll('digits-lr', None, None)\n"
        "print(json.dumps(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
