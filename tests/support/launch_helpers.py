"""Start real `campaign` processes against a test ledger and wait on ledger conditions."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from campaign.ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]


def cli(url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "campaign", "--ledger", url, *args]


def start(url: str, *args: str, env: dict[str, str] | None = None,
          **kwargs: object) -> subprocess.Popen[str]:
    """A `campaign` process in the repository root (so `tests.support.tasks...` imports);
    ``env``: variables set for it on top of this process's."""
    return subprocess.Popen(
        cli(url, *args), cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        **kwargs,  # type: ignore[arg-type]
    )


def run(url: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli(url, *args), cwd=ROOT, text=True, capture_output=True, timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def invoke(url: str, *args: str, cwd: Path = ROOT,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A `campaign` command in this process (click's runner), for tests where the command's
    own process is not under test: its runs still train in children of this process's task
    host, each as fresh as a new interpreter (docs/processes.md), without a new torch import
    per command. The result reads like a finished process."""
    return in_process("--ledger", url, *args, cwd=cwd, env=env)


def in_process(*args: str, cwd: Path = ROOT,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`campaign ARGS` as typed in ``cwd`` (its default ledger, campaign.db there), run as
    :func:`invoke` runs it. Only the command's own output is captured: what a run's process
    prints goes to this process's stderr, so a test of that output starts a real process."""
    from click.testing import CliRunner

    from campaign.cli import main

    with contextlib.chdir(cwd), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # then a fresh interpreter's defaults in front
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                         ResourceWarning):
            warnings.filterwarnings("ignore", category=category)
        result = CliRunner().invoke(main, list(args),
                                    env={"OMP_NUM_THREADS": "1", **(env or {})})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    # A warning the command raised is on its stderr, once per place, as a process prints it.
    shown = dict.fromkeys(warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
                          for w in caught)
    return subprocess.CompletedProcess(["campaign", *args], result.exit_code, result.stdout,
                                       result.stderr + "".join(shown))


def reproduced_elsewhere(project: Path, archive: Path, cwd: Path,
                         *args: str) -> subprocess.CompletedProcess[str]:
    """`campaign reproduce ARCHIVE --dir again --trust-task-code --format json ARGS` in
    ``cwd`` with the ``project`` folder moved away meanwhile: only the archive is read."""
    hidden = project.with_name("hidden")
    project.rename(hidden)
    try:
        return in_process("reproduce", str(archive), "--dir", "again", "--trust-task-code",
                          "--format", "json", *args, cwd=cwd)
    finally:
        hidden.rename(project)


def run_interrupt_resume(url: str, artifacts: str, references: tuple[str, ...], cut: str,
                         reason: str) -> None:
    """`campaign run` of each reference run (exit 0) and of ``cut``, whose task sends itself a
    SIGTERM (exit 1: interrupted), then `campaign resume` of ``cut`` in a new process (a fresh
    child of the task host; exit 0): what every exact-resume test compares afterwards."""
    skip = ("--skip-pilot", "--reason", reason)
    for run_id in references:
        done = invoke(url, "run", run_id, "--artifacts", artifacts, *skip)
        assert done.returncode == 0, done.stderr[-3000:]
    interrupted = invoke(url, "run", cut, "--artifacts", artifacts, *skip)
    assert interrupted.returncode == 1, interrupted.stderr[-3000:]
    resumed = invoke(url, "resume", cut, "--artifacts", artifacts)
    assert resumed.returncode == 0, resumed.stderr[-3000:]


def wait_for(condition: Callable[[], bool], timeout: float, what: str, every: float = 0.1) -> float:
    """Poll ``condition`` until true; returns the seconds it took; fails after ``timeout``."""
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > timeout:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)
    return time.monotonic() - began


def last_step(ledger: Ledger, run_id: str) -> int:
    return ledger.latest_steps([run_id]).get(run_id, 0)


def losses(ledger: Ledger, run_id: str) -> pd.Series:
    """The run's train/loss series as readers see it (latest segment per step)."""
    frame = ledger.metrics(runs=[run_id], keys=["train/loss"])
    return frame.set_index("step")["value"]


def event_counts(ledger: Ledger, campaign: str) -> pd.DataFrame:
    """Events per run and kind (rows: runs; columns: kinds)."""
    events = ledger.events(campaign)
    events = events[events["run_id"].notna()]
    return events.groupby(["run_id", "kind"]).size().unstack(fill_value=0)
