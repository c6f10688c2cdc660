"""The supervisor ends every run (issue 14): user code that hangs, exits, raises, segfaults,
forks or prints, each ending with a recorded cause. Real `campaign run` processes where what
the command prints is under test; the hangs run the same supervisor in this process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from campaign.cli import main
from campaign.host.processes import process_state
from campaign.ledger import Ledger
from tests.support.launch_helpers import invoke
from tests.support.loop_helpers import plan_loop

TASK = "tests.support.tasks.misbehaving:build"


@pytest.fixture
def ledger(sqlite_url: str) -> Any:
    with Ledger.open(sqlite_url, create=True) as opened:
        yield opened


def _plan_with_stop(ledger: Ledger, name: str, stop: dict[str, Any], **task: Any) -> str:
    return plan_loop(
        ledger, name, task=TASK,
        hold={"loop.microbatch": 4, "loop.accumulation": 2, "budget.updates": 4},
        config={"optimizer.lr": 0.1, "optimizer.name": "sgd",
                **{f"task.{k}": v for k, v in task.items()}},
        validation={"every": 4}, stop=stop, seeds=[0],
    )[0]


def _command(url: str, tmp_path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "campaign", "--ledger", url, *args,
            "--artifacts", str(tmp_path / "art")]


def _run(url: str, tmp_path: Path, run_id: str, *extra: str, timeout: float = 120,
         process: bool = True) -> tuple:
    """`campaign run` in a real process (``process``: its own output is under test), else in
    this one: the supervisor is the same code, the run a child of this process's task host."""
    arguments = ("run", run_id, "--skip-pilot", "--reason", "supervisor test", "--stop-grace-s",
                 "2", *extra)
    started = time.monotonic()
    if process:
        done = subprocess.run(_command(url, tmp_path, *arguments), capture_output=True,
                              text=True, timeout=timeout)
    else:  # the same guard against a hang as the process's timeout
        def expire(*_: object) -> None:
            raise TimeoutError(f"campaign run {run_id} did not end within {timeout:g} s")

        previous = signal.signal(signal.SIGALRM, expire)
        signal.alarm(int(timeout))
        try:
            done = invoke(url, *arguments, "--artifacts", str(tmp_path / "art"))
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
    return done, time.monotonic() - started


def _end(ledger: Ledger, run_id: str) -> tuple:
    run = ledger.run(run_id)
    return run.status, run.stop_cause, run.stop_phase


@pytest.mark.slow
def test_a_hang_ends_at_the_hard_wall_time(ledger: Ledger, sqlite_url: str, tmp_path: Path) -> None:
    run_id = _plan_with_stop(ledger, "wall", {"wall_time": "5s"}, misbehave="hang")
    done, elapsed = _run(sqlite_url, tmp_path, run_id, process=False)
    assert _end(ledger, run_id) == ("stopped", "wall_time", "forward"), done.stderr
    assert done.returncode == 0 and "Traceback" not in done.stderr
    # It ends (the 120 s timeout guards a hang) and never before its wall time.
    assert elapsed >= 5
    assert "hard wall-time limit 5s" in str(ledger.run(run_id).stop_detail)


def test_a_hang_without_progress_is_stalled(
    ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    run_id = _plan_with_stop(ledger, "stall", {"wall_time": "10m", "stall": "4s"},
                             misbehave="hang")
    done, elapsed = _run(sqlite_url, tmp_path, run_id, process=False)
    assert _end(ledger, run_id) == ("failed", "stalled", "forward")
    assert done.returncode == 1 and elapsed >= 4  # not before the stall window has passed
    assert "no progress for 4 s in forward after update 0" in str(ledger.run(run_id).stop_detail)
    assert "run " + run_id + ": failed (stalled)" in done.stderr


def test_a_hang_in_backward_is_recorded_in_backward(
    ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    run_id = _plan_with_stop(ledger, "stall-backward", {"wall_time": "10m", "stall": "4s"},
                             misbehave="hang_backward")
    done, _ = _run(sqlite_url, tmp_path, run_id, process=False)
    assert _end(ledger, run_id) == ("failed", "stalled", "backward"), done.stderr
    assert "no progress for 4 s in backward after update 0" in str(ledger.run(run_id).stop_detail)


@pytest.mark.parametrize(
    ("misbehave", "detail"),
    [
        ("exit0", "SystemExit: 0"),
        ("exit7", "SystemExit: 7"),
        ("keyboard", "KeyboardInterrupt"),
        ("os_exit3", "exited with status 3 in forward after update 0"),
        ("segv", "was killed by SIGSEGV in forward"),
        ("negative", "a number of units is never negative"),
    ],
)
def test_task_code_that_exits_or_crashes_ends_the_run(
    ledger: Ledger, sqlite_url: str, tmp_path: Path, misbehave: str, detail: str
) -> None:
    run_id = _plan_with_stop(ledger, f"x-{misbehave}", {}, misbehave=misbehave)
    # The deaths the process sees from outside in a real one; the raised ones in this process.
    done, _ = _run(sqlite_url, tmp_path, run_id, process=misbehave in ("segv", "os_exit3"))
    status, cause, _ = _end(ledger, run_id)
    assert (status, cause) == ("failed", "exception"), done.stderr
    assert detail in str(ledger.run(run_id).stop_detail)
    assert done.returncode == 1 and "Traceback" not in done.stderr and done.stdout == ""
    assert f"run {run_id}: failed (exception)" in done.stderr


def test_a_forked_orphan_dies_with_the_run(ledger: Ledger, sqlite_url: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "orphan.pid"
    run_id = _plan_with_stop(ledger, "orphan", {"stall": "4s"}, misbehave="orphan",
                             pidfile=str(pidfile))
    _run(sqlite_url, tmp_path, run_id, process=False)
    assert _end(ledger, run_id)[:2] == ("failed", "stalled"), ledger.run(run_id).stop_detail
    orphan = int(pidfile.read_text())
    time.sleep(0.5)
    assert process_state(orphan) in (None, "Z", "X")  # gone, or dead and waiting for init


def test_a_setsid_daemon_the_task_starts_dies_with_the_run(
    ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    """A double-forked daemon in its own session leaves the run's process group; the run's
    process is its subreaper and ends it when the run completes."""
    pidfile = tmp_path / "daemon.pid"
    run_id = _plan_with_stop(ledger, "daemon", {}, misbehave="daemon", pidfile=str(pidfile))
    done, _ = _run(sqlite_url, tmp_path, run_id, process=False)
    assert _end(ledger, run_id)[:2] == ("completed", "budget_reached"), done.stderr
    daemon = int(pidfile.read_text())
    time.sleep(0.5)
    assert process_state(daemon) in (None, "Z", "X")


def test_task_output_goes_to_the_log_artifact(
    ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    run_id = _plan_with_stop(ledger, "chatty", {}, misbehave="chatty")
    done, _ = _run(sqlite_url, tmp_path, run_id)
    assert ledger.run(run_id).status == "completed", done.stderr
    assert "hello" not in done.stdout + done.stderr
    artifacts = ledger.artifacts("chatty")
    logs = artifacts[(artifacts["run_id"] == run_id) & (artifacts["kind"] == "log")]
    assert len(logs) == 1
    text = Path(logs["path"].iloc[0]).read_text()
    assert "task says hello on stdout" in text and "task says hello on stderr" in text
    shown = CliRunner().invoke(main, ["--ledger", sqlite_url, "show", run_id, "--format", "json"])
    assert json.loads(shown.stdout)["log"] == logs["path"].iloc[0]  # where to find it


@pytest.mark.slow
def test_sigterm_to_launch_during_a_hang_ends_within_the_grace(
    ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    run_id = _plan_with_stop(ledger, "term", {"wall_time": "10m"}, misbehave="hang")
    launcher = subprocess.Popen(
        _command(sqlite_url, tmp_path, "launch", "term", "--skip-pilot", "--reason", "test",
                 "--stop-grace-s", "2", "--no-replay-check"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 60
    while ledger.run(run_id).status != "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # inside the hang
    launcher.send_signal(signal.SIGTERM)
    try:
        launcher.wait(timeout=60)
    finally:
        launcher.kill()
    assert _end(ledger, run_id)[:2] == ("interrupted", "interrupted")
    assert "did not stop within 2 s" in str(ledger.run(run_id).stop_detail)


def _spec_file(tmp_path: Path, **task: str) -> str:
    lines = "\n".join(f'"task.{k}" = "{v}"' for k, v in task.items())
    path = tmp_path / "spec.toml"
    path.write_text(f"""
[campaign]
name = "guarded"
question = "does plan survive its task?"
task = "{TASK}"
[hold]
"loop.microbatch" = 4
"budget.updates" = 4
[config]
{lines}
[validation]
every = 4
metric = "val/accuracy"
mode = "max"
[grid]
seeds = [0]
control = "only"
[[grid.variants]]
name = "only"
""")
    return str(path)


def _plan_cli(url: str, spec: str, *extra: str, timeout_s: str = "300") -> Any:
    env = {**os.environ, "CAMPAIGN_TASK_TIMEOUT_S": timeout_s}
    return subprocess.run([sys.executable, "-m", "campaign", "--ledger", url, "plan", spec, *extra],
                          capture_output=True, text=True, timeout=300, env=env)


def test_plan_refuses_a_factory_that_exits(sqlite_url: str, tmp_path: Path) -> None:
    done = _plan_cli(sqlite_url, _spec_file(tmp_path, factory="exit0"), "--dry-run")
    assert done.returncode == 2 and done.stdout == ""
    assert "task code raised SystemExit(0)" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_plan_gives_up_on_a_hanging_task(sqlite_url: str, tmp_path: Path) -> None:
    started = time.monotonic()
    done = _plan_cli(sqlite_url, _spec_file(tmp_path, splits="hang"), "--dry-run", timeout_s="3")
    assert done.returncode == 2, done.stderr
    assert "did not return within 3 s" in done.stderr
    assert time.monotonic() - started < 120


@pytest.mark.slow
def test_plan_json_stays_json_when_the_task_prints(sqlite_url: str, tmp_path: Path) -> None:
    done = _plan_cli(sqlite_url, _spec_file(tmp_path, factory="chatty"), "--dry-run",
                     "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["campaign"] == "guarded"
    assert "a factory that talks on stdout" in done.stderr
