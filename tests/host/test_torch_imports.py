"""One torch import per command (docs/processes.md): only task hosts import torch, at most one per
process that runs task code or places runs (a local launch's workers share their launcher's);
the command line and the launcher import none.

Counted with an interpreter-start hook (tests/support/torch_counter/sitecustomize.py on PYTHONPATH)
that logs the pid of every interpreter that imports torch; forked children inherit it and log
nothing. On SQLite and on PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from campaign.ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]
COUNTER = ROOT / "tests" / "support" / "torch_counter"
SPEC = """
[campaign]
name = "count"
question = "how many interpreters import torch?"
task = "tests.support.tasks.faulty:build"

[hold]
"loop.microbatch" = 4
"loop.accumulation" = 2
"budget.updates" = 6

[config]
"optimizer.name" = "adamw"
"optimizer.lr" = 1e-2
"task.limit" = 200
"task.fault" = "sigterm"
"task.at" = 3
"task.marker" = "{marker}"

[validation]
every = 3
metric = "val/accuracy"
mode = "max"

[grid]
seeds = [0, 1, 2]
control = "only"

[[grid.variants]]
name = "only"
"""


class Counter:
    """Runs ``campaign`` commands and counts the torch-importing interpreters of each."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.url, self.tmp_path, self.log = url, tmp_path, tmp_path / "torch-imports.log"
        self.env = {**os.environ, "CAMPAIGN_TEST_TORCH_LOG": str(self.log),
                    "PYTHONPATH": os.pathsep.join([str(COUNTER), str(ROOT)])}

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "campaign", "--ledger", self.url, *args]

    def count(self, *args: str, expect: int = 0) -> int:
        self.log.unlink(missing_ok=True)
        done = subprocess.run(self.command(*args), cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == expect, (args, done.stderr[-2000:])
        return len(set(self.log.read_text().split())) if self.log.exists() else 0

    def count_serving(self) -> int:
        """``campaign serve`` until it listens, then Ctrl-C."""
        self.log.unlink(missing_ok=True)
        server = subprocess.Popen(self.command("serve", "--port", "0"), cwd=ROOT, env=self.env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert server.stdout is not None
        for line in server.stdout:
            if "http://" in line:
                break
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)
        return len(set(self.log.read_text().split())) if self.log.exists() else 0


@pytest.mark.slow
def test_each_command_starts_at_most_one_torch_interpreter_per_host(
    ledger_url: str, tmp_path: Path
) -> None:
    spec = tmp_path / "count.toml"
    spec.write_text(SPEC.format(marker=tmp_path / "sigterm-once"))
    counter = Counter(ledger_url, tmp_path)
    art = ("--artifacts", str(tmp_path / "art"))
    skip = ("--skip-pilot", "--reason", "counting interpreters")
    assert counter.count("plan", str(spec), "--dry-run") == 1
    counter.env["CAMPAIGN_LEDGER"] = ledger_url
    assert counter.count("plan", str(spec)) == 1
    with Ledger.open(ledger_url) as ledger:
        first, *_ = ledger.runs("count")["run_id"]
    # the task SIGTERMs its run once (the marker): run ends interrupted (exit 1), then resumes
    assert counter.count("run", first, *art, *skip, expect=1) == 1
    assert counter.count("resume", first, *art) == 1  # its replay forked from the same host
    assert counter.count("pilot", "count", *art) == 1  # its fresh-process checks too
    # its two workers join the launcher's host: one torch import for the whole launch
    assert counter.count("launch", "count", "--workers", "2", *art) == 1
    for listing in (("status", "count"), ("runs", "count"),
                    ("report", "count", "--format", "json", "--output", "-")):
        assert counter.count(*listing) == 0, listing
    assert counter.count_serving() == 0
    with Ledger.open(ledger_url) as ledger:
        assert set(ledger.runs("count")["status"]) == {"completed"}
