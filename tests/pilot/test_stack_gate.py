"""The software stack is a gate (docs/report.md, pilot phases): a task's declared needs and
the precision against the device are checked by the pilot, `doctor CAMPAIGN`,
the launch and each worker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from campaign.cli import main
from campaign.errors import StackRefused
from campaign.gates.stack_gate import stack_problems
from campaign.launch.worker import WorkerOptions, run_worker
from campaign.ledger import Ledger
from campaign.stack.devices import precision_problem
from tests.support.loop_helpers import plan_loop

DEMANDING = "tests.support.tasks.demanding:build"
# On an interpreter's first import of pandas: its command line, one line in the log.
PANDAS_HOOK = """
import importlib.abc, os, sys
class _FirstPandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pandas":
            sys.meta_path.remove(self)
            with open(os.environ["CAMPAIGN_TEST_PANDAS_LOG"], "a") as log:
                log.write(" ".join(sys.argv) + "\\n")
        return None
if os.environ.get("CAMPAIGN_TEST_PANDAS_LOG"):
    sys.meta_path.insert(0, _FirstPandas())
"""


def test_declared_needs_are_named() -> None:
    problems = stack_problems(DEMANDING)
    assert any("package torch" in p and "the task needs >=99" in p for p in problems)
    assert any("module no_such_extension_for_campaign does not import" in p for p in problems)
    assert stack_problems("campaign.tasks.digits:build") == []
    assert precision_problem("fp16", "cpu") and precision_problem("bf16", "cpu") is None


def test_a_stack_that_misses_the_needs_is_refused_everywhere(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    run_id = plan_loop(sqlite_ledger, task=DEMANDING)[0]
    runner = CliRunner()
    pilot = runner.invoke(main, ["--ledger", sqlite_url, "pilot", "loop", "--artifacts",
                                 str(tmp_path)])
    assert pilot.exit_code == 1 and "software stack: package torch" in pilot.stdout
    doctor = runner.invoke(main, ["--ledger", sqlite_url, "doctor", "loop", "--format", "json"])
    assert doctor.exit_code == 1 and "refuses to claim" in doctor.stdout
    with pytest.raises(StackRefused, match="the task needs >=99"):
        run_worker(sqlite_ledger, WorkerOptions("loop", tmp_path / "a"))
    launch = runner.invoke(main, ["--ledger", sqlite_url, "launch", "loop", "--skip-pilot",
                                  "--reason", "x", "--artifacts", str(tmp_path)])
    assert launch.exit_code == 1 and "refuses to claim" in launch.stderr, launch.output
    assert sqlite_ledger.run(run_id).status == "planned"  # nothing was claimed


def test_a_device_that_does_not_exist_is_refused_before_anything_is_written(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    """cuda:7 on this machine: doctor says this stack cannot run it (exit 1), the pilot refuses
    in one line (exit 1: the checked thing, this machine) without a pilot row, a name that is
    no device is bad input (exit 2), and a worker claims nothing."""
    run_id = plan_loop(sqlite_ledger)[0]
    runner = CliRunner()
    doctor = runner.invoke(main, ["--ledger", sqlite_url, "doctor", "loop", "--device", "cuda:7"])
    assert doctor.exit_code == 1 and "device cuda:7 does not exist here" in doctor.stdout
    pilot = runner.invoke(main, ["--ledger", sqlite_url, "pilot", "loop", "--device", "cuda:7",
                                 "--artifacts", str(tmp_path)])
    assert pilot.exit_code == 1 and "--device cuda:7: device cuda:7 does not exist" in pilot.stderr
    assert len(pilot.stderr.strip().splitlines()) == 1 and sqlite_ledger.pilots("loop").empty
    named = runner.invoke(main, ["--ledger", sqlite_url, "pilot", "loop", "--device", "tpu:0",
                                 "--artifacts", str(tmp_path)])
    assert named.exit_code == 2 and "'tpu:0' is not a torch device" in named.stderr
    assert len(named.stderr.strip().splitlines()) == 1 and sqlite_ledger.pilots("loop").empty
    passed = runner.invoke(main, ["--ledger", sqlite_url, "pilot", "loop", "--artifacts",
                                  str(tmp_path)])
    assert passed.exit_code == 0, passed.stderr  # every class piloted now on cpu ...
    again = runner.invoke(main, ["--ledger", sqlite_url, "pilot", "loop", "--device", "cuda:7",
                                 "--artifacts", str(tmp_path)])
    assert again.exit_code == 1 and "device cuda:7 does not exist" in again.stderr  # ... still
    worker = runner.invoke(main, ["--ledger", sqlite_url, "worker", "loop", "--device", "cuda:7",
                                  "--skip-pilot", "--reason", "x", "--artifacts", str(tmp_path)])
    assert worker.exit_code == 1 and "refuses to claim" in worker.stderr
    assert sqlite_ledger.run(run_id).status == "planned"


def test_a_launched_worker_records_how_its_stack_differs_from_the_pilots(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A pilot that passed on another stack (Python 2.7.0): the launch's worker (a real
    process) compares its own stack in the child of its task host that checks the stack's
    fitness, prints and records the difference once, and runs the run, without importing
    pandas itself (an import hook in every process the launch starts logs who imports it)."""
    from campaign.gates.classes import run_classes
    from campaign.stack.software import environment
    from tests.support.launch_helpers import invoke
    from tests.support.loop_helpers import plan_quick

    run_id = plan_quick(sqlite_ledger, "stacked", runs=1, updates=2)[0]
    record, [class_id] = sqlite_ledger.campaign("stacked"), run_classes(sqlite_ledger, "stacked")
    stack = {**environment(record.task), "python": "2.7.0"}
    pilot = sqlite_ledger.create_pilot("stacked", record.spec_sha256, stack, class_id)
    sqlite_ledger.set_pilot_verdict(pilot, "pass")
    hook, log = tmp_path / "hook", tmp_path / "pandas.log"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(PANDAS_HOOK)
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH")) if p)
    done = invoke(sqlite_url, "launch", "stacked", "--workers", "1", "--no-replay-check",
                  "--artifacts", str(tmp_path / "artifacts"),
                  env={"PYTHONPATH": path, "CAMPAIGN_TEST_PANDAS_LOG": str(log)})
    assert done.returncode == 0, done.stderr
    importers = log.read_text().splitlines() if log.exists() else []
    assert not [line for line in importers if " worker stacked " in f" {line} "], importers
    said = capfd.readouterr().err  # the worker's own stderr (a process: not the runner's)
    assert said.count("warning: stack differs from the pilot's: python: pilot '2.7.0'") == 1
    events = sqlite_ledger.events("stacked")
    differences = events[events["kind"] == "stack_difference"]["detail"].tolist()
    worker = [d for d in differences if d.startswith("launch worker on a stack unlike")]
    assert len(worker) == 1 and "python: pilot '2.7.0', now " in worker[0], differences
    assert sqlite_ledger.run(run_id).status == "completed"
