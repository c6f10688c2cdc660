"""A kill is not a verdict (docs/runs.md, faults): a run's process killed by a signal its
supervisor did not send (here the task SIGKILLs itself, as the kernel's OOM killer would) ends
`interrupted`/`killed`, resumes from its last checkpoint and ends with the series of its
uninterrupted twin; killed twice at one update it is `failed`/`killed`, both kills its
evidence. A crash the process raises on itself (SIGSEGV) stays `failed`/`exception` (the
supervisor tests). Both engines, the real command line in-process, the run in a host child."""

from __future__ import annotations

import shlex
from pathlib import Path

import pandas as pd
from click.testing import CliRunner

from campaign.cli import main
from campaign.ledger import Ledger
from campaign.loop.train import execute
from tests.support.launch_helpers import losses
from tests.support.loop_helpers import plan_loop

TASK = "tests.support.tasks.faulty:build"
SKIP = ("--skip-pilot", "--reason", "a test of kills, not of the pilot")
HOLD = {"loop.checkpoint_every": 2}
AT = 11  # the 11th training microbatch: update 6 (two microbatches an update)


def _cli(url: str, *args: str) -> tuple[int, str]:
    done = CliRunner().invoke(main, ["--ledger", url, *args])
    return done.exit_code, done.stderr


def test_a_killed_run_is_interrupted_then_resumes_exactly(ledger: Ledger, ledger_url: str,
                                                          tmp_path: Path) -> None:
    (twin,) = plan_loop(ledger, "twin", task=TASK, hold=HOLD)
    execute(ledger, twin, artifacts=tmp_path / "twin", replay_in_subprocess=False)
    (run_id,) = plan_loop(ledger, "killed", task=TASK, hold=HOLD,
                          config={"task.fault": "selfkill", "task.at": AT,
                                  "task.marker": str(tmp_path / "killed-once")})
    artifacts = str(tmp_path / "artifacts")
    code, said = _cli(ledger_url, "run", run_id, "--artifacts", artifacts, "--no-replay-check",
                      *SKIP)
    assert code == 1, said
    record = ledger.run(run_id)
    assert (record.status, record.stop_cause, record.stop_step) == ("interrupted", "killed", 5)
    assert "was killed by SIGKILL" in record.stop_detail and "supervisor did not send" in (
        record.stop_detail)
    assert "died with its task host" not in record.stop_detail
    assert "its last checkpoint is at update 4" in record.stop_detail
    assert f"campaign resume {run_id}" in record.stop_detail

    code, said = _cli(ledger_url, "resume", run_id, "--artifacts", artifacts, "--no-replay-check")
    assert code == 0, said
    assert ledger.run(run_id).status == "completed"
    pd.testing.assert_series_equal(losses(ledger, run_id), losses(ledger, twin),
                                   check_exact=True)  # bit for bit, every update once
    kills = ledger.events("killed", run_id=run_id)
    assert list(kills["kind"]).count("killed") == 1


def test_a_kill_in_a_resumed_segments_setup_is_at_its_checkpoint(ledger: Ledger,
                                                                  ledger_url: str,
                                                                  tmp_path: Path) -> None:
    """Killed at update 5 (checkpoint at 4), then killed again while the resume sets up: the
    second kill is at update 4 (where the segment starts), not at update 0; a third there is
    the second at that update, so `failed`."""
    marker = str(tmp_path / "killed-once")
    (run_id,) = plan_loop(ledger, "setupkill", task=TASK, hold=HOLD,
                          config={"task.fault": "selfkill", "task.at": AT, "task.marker": marker,
                                  "task.setup_kill_after": marker})
    artifacts = str(tmp_path / "artifacts")
    _cli(ledger_url, "run", run_id, "--artifacts", artifacts, "--no-replay-check", *SKIP)
    assert ledger.run(run_id).stop_step == 5
    _cli(ledger_url, "resume", run_id, "--artifacts", artifacts, "--no-replay-check")
    record = ledger.run(run_id)
    assert (record.status, record.stop_cause, record.stop_step) == ("interrupted", "killed", 4)
    assert "after update 4" in record.stop_detail
    _cli(ledger_url, "resume", run_id, "--artifacts", artifacts, "--no-replay-check")
    record = ledger.run(run_id)
    assert (record.status, record.stop_cause, record.stop_step) == ("failed", "killed", 4)


def test_killed_twice_at_one_update_is_failed_with_both_kills(ledger: Ledger, ledger_url: str,
                                                              tmp_path: Path) -> None:
    """No checkpoint before the kill: the resume starts again at update 0 and is killed at
    the same update, by the run itself, so the second kill is the run's verdict."""
    (run_id,) = plan_loop(ledger, "again", task=TASK, hold={"loop.checkpoint_every": 100},
                          config={"task.fault": "selfkill", "task.at": AT})
    artifacts = str(tmp_path / "artifacts")
    code, said = _cli(ledger_url, "run", run_id, "--artifacts", artifacts, *SKIP)
    assert code == 1, said
    first = ledger.run(run_id)
    assert (first.status, first.stop_cause) == ("interrupted", "killed")
    assert "no checkpoint yet" in first.stop_detail
    code, said = _cli(ledger_url, "resume", run_id, "--artifacts", artifacts)
    assert code == 1, said
    second = ledger.run(run_id)
    assert (second.status, second.stop_cause, second.stop_step) == ("failed", "killed",
                                                                    first.stop_step)
    assert "the second time at this update" in second.stop_detail
    events = ledger.events("again", run_id=run_id)
    assert [d.split(":")[0] for d in events.loc[events["kind"] == "killed", "detail"]] == [
        f"update {first.stop_step}", f"update {first.stop_step}"]


def test_a_slurm_array_task_resumes_a_killed_run_like_a_preempted_one(
        ledger: Ledger, ledger_url: str, tmp_path: Path) -> None:
    """`worker --slurm` (what an array task runs) takes interrupted runs that a preemption or
    a kill ended before planned ones, as a requeued task would."""
    (run_id,) = plan_loop(ledger, "array", task=TASK, hold=HOLD,
                          config={"task.fault": "selfkill", "task.at": AT,
                                  "task.marker": str(tmp_path / "killed-once")})
    artifacts = str(tmp_path / "artifacts")
    assert _cli(ledger_url, "run", run_id, "--artifacts", artifacts, *SKIP)[0] == 1
    assert ledger.run(run_id).stop_cause == "killed"
    code, said = _cli(ledger_url, "worker", "array", "--slurm", "--artifacts", artifacts,
                      "--no-replay-check", *SKIP)
    assert code == 0, said
    assert ledger.run(run_id).status == "completed"
    segments = ledger.segments("array")
    assert list(segments.loc[segments["run_id"] == run_id, "start_step"]) == [0, 4]


def test_a_launch_left_unfinished_names_each_run_and_the_command_that_continues(
        sqlite_url: str, tmp_path: Path) -> None:
    """The launcher's last lines after a kill: the run, where it stands, its last checkpoint,
    the planned runs never started, and the one command that goes on (which then does)."""
    with Ledger.open(sqlite_url, create=True) as ledger:
        plan_loop(ledger, "left", task=TASK, hold=HOLD, seeds=[0, 1],
                  config={"task.fault": "selfkill", "task.at": AT,
                          "task.marker": str(tmp_path / "killed-once")})
        from campaign.launch.left_behind import left_behind

        assert left_behind(ledger, "left") == ["2 planned runs never started",
                                               "continue with: campaign launch left"]
    artifacts = str(tmp_path / "artifacts")
    code, said = _cli(sqlite_url, "launch", "left", "--workers", "1", "--artifacts", artifacts,
                      "--no-replay-check", *SKIP)
    assert code == 1, said
    assert "campaign: left: 1 interrupted" in said
    assert "interrupted (killed) at update 5, last checkpoint at update 4" in said
    with Ledger.open(sqlite_url) as ledger:  # the kill was its run's: the worker went on
        assert sorted(ledger.runs("left")["status"]) == ["completed", "interrupted"]
    # The line to paste: where the launch ran and on what, then the flag that resumes.
    (command,) = [line.split("continue with: ", 1)[1] for line in said.splitlines()
                  if "continue with: " in line]
    words = shlex.split(command)
    assert words[:3] == ["campaign", "launch", "left"] and words[-1] == "--resume-interrupted"
    assert {"--ledger", "--workers", "--artifacts", "--skip-pilot"} <= set(words)
    done = CliRunner().invoke(main, words[1:])
    assert done.exit_code == 0, done.stderr
    with Ledger.open(sqlite_url) as ledger:
        assert set(ledger.runs("left")["status"]) == {"completed"}


def test_a_run_relaunched_under_a_new_id_is_not_left_behind(sqlite_ledger: Ledger) -> None:
    from campaign.launch.left_behind import left_behind
    from campaign.ledger.records import StopRecord

    (run_id,) = plan_loop(sqlite_ledger, "relaunched", task=TASK, hold=HOLD)
    claim = sqlite_ledger.claim_next("relaunched", "w")
    assert claim is not None
    sqlite_ledger.finish(run_id, "interrupted", StopRecord("killed", step=3), lease=claim.lease)
    assert left_behind(sqlite_ledger, "relaunched")[0].startswith(f"run {run_id} ")
    record = sqlite_ledger.run(run_id)
    sqlite_ledger.add_run("relaunched", record.variant, int(record.seed), record.config_document,
                          relaunch_of=run_id, reason="a new id")
    assert left_behind(sqlite_ledger, "relaunched") == [
        "1 planned run never started", "continue with: campaign launch relaunched"]
