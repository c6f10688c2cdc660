"""Nothing is claimed that cannot run: `run` and `resume` check the device and the task's
declared requirements before they claim or change a run, as a worker does before its first
claim. A refusal is one line, exit 2, and the run keeps its status and its segments."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from campaign.cli import main
from campaign.ledger import Ledger
from tests.support.loop_helpers import plan_loop

SKIP = ("--skip-pilot", "--reason", "a test of refusals, not of the pilot")
NO_SUCH_GPU = "cuda:99"  # an index no machine of this project's has


def _segments(url: str, run_id: str) -> int:
    with Ledger.open(url) as ledger:
        segments = ledger.segments(ledger.run(run_id).campaign)
    return int((segments["run_id"] == run_id).sum())


@pytest.mark.parametrize(("device", "said"), [
    ("gpu", "device 'gpu' is not a torch device"),
    (NO_SUCH_GPU, f"device {NO_SUCH_GPU} does not exist here"),
])
def test_run_on_a_device_this_machine_lacks_claims_nothing(tmp_path: Path, device: str,
                                                         said: str) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger.open(url, create=True) as ledger:
        (run_id,) = plan_loop(ledger)
    done = CliRunner().invoke(main, ["--ledger", url, "run", run_id, "--device", device,
                                     "--artifacts", str(tmp_path / "a"), *SKIP])
    assert done.exit_code == 2, done.output
    assert done.stderr.count("\n") == 1 and said in done.stderr
    assert f"run {run_id} stays planned" in done.stderr
    with Ledger.open(url) as ledger:
        assert ledger.run(run_id).status == "planned"
    assert _segments(url, run_id) == 0


def test_run_of_a_task_whose_requirements_are_missing_claims_nothing(tmp_path: Path) -> None:
    """`--skip-pilot` skips the pilot, not the stack: a worker refuses this task too."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger.open(url, create=True) as ledger:
        (run_id,) = plan_loop(ledger, task="tests.support.tasks.demanding:build")
    done = CliRunner().invoke(main, ["--ledger", url, "run", run_id, "--artifacts",
                                     str(tmp_path / "a"), *SKIP])
    assert done.exit_code == 2, done.output
    assert "package torch" in done.stderr and "no_such_extension_for_campaign" in done.stderr
    with Ledger.open(url) as ledger:
        assert ledger.run(run_id).status == "planned"


def test_resume_on_a_missing_device_leaves_the_run_interrupted(tmp_path: Path) -> None:
    """An interrupted run (stopped by a signal at update 2 of 6) asked to resume on a device
    this machine lacks stays interrupted, its stop and its segments as they were."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    artifacts = str(tmp_path / "a")
    with Ledger.open(url, create=True) as ledger:
        (run_id,) = plan_loop(ledger, task="tests.support.tasks.faulty:build",
                              config={"task.fault": "sigterm", "task.at": 2,
                                      "task.marker": str(tmp_path / "signalled")})
    runner = CliRunner()
    first = runner.invoke(main, ["--ledger", url, "run", run_id, "--artifacts", artifacts,
                                 *SKIP])
    assert first.exit_code == 1, first.output
    with Ledger.open(url) as ledger:
        before = ledger.run(run_id)
    assert before.status == "interrupted"
    refused = runner.invoke(main, ["--ledger", url, "resume", run_id, "--device", NO_SUCH_GPU,
                                   "--artifacts", artifacts])
    assert refused.exit_code == 2, refused.output
    assert f"run {run_id} stays interrupted" in refused.stderr
    with Ledger.open(url) as ledger:
        after = ledger.run(run_id)
    assert (after.status, after.stop_step, after.stop_cause) == (
        before.status, before.stop_step, before.stop_cause)
    assert _segments(url, run_id) == 1
