"""No run does more updates than its budget, whatever stops it (issue 26, item 1).

A SIGTERM in the last update checkpoints at the budget; the resume from it ends at once, on
a validation point, with the unbroken run's updates and examples. A machine lost during the
final artifact's replay: the resume completes from the recorded final artifact and never
rewrites it. An older ledger whose run went past its budget gets the ``budget_exceeded``
flag and its value is not counted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from campaign.ledger import Ledger, NewRun, NewVariant, StopRecord
from campaign.loop.checkpoint_file import file_sha256
from campaign.loop.train import execute
from campaign.report.balance import balance_sheet
from tests.support.loop_helpers import plan_loop

ROOT = Path(__file__).resolve().parents[2]
FAULTY = "tests.support.tasks.faulty:build"


def _curve(ledger: Ledger, key: str = "train/loss") -> tuple[list[int], int]:
    points = ledger.metrics("loop", keys=[key])
    return list(points["step"]), int(points["examples_seen"].max())


def _killed_in_its_replay(url: str, run_id: str, artifacts: Path, marker: Path,
                          reason: str) -> None:
    """``campaign run`` of a ``sigkill_in_replay`` run: its supervisor dies in the replay."""
    died = subprocess.run(
        [sys.executable, "-m", "campaign", "run", run_id, "--artifacts", str(artifacts),
         "--skip-pilot", "--reason", reason],
        cwd=ROOT, env={**os.environ, "CAMPAIGN_LEDGER": url}, capture_output=True,
    )
    assert died.returncode == -9 and marker.exists(), died.stderr


def test_a_signal_in_the_last_update_never_goes_past_the_budget(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Budget 12 x accumulation 2: the SIGTERM comes in microbatch 24, the last; validation
    every 5, so the budget is not a validation point and the resume validates at 12."""
    marker = tmp_path / "signalled"
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id = plan_loop(ledger, task=FAULTY, validation={"every": 5},
                           config={"task.fault": "sigterm", "task.at": 24,
                                   "task.marker": str(marker)})[0]
        first = execute(ledger, run_id, artifacts=tmp_path / "a", replay_in_subprocess=False)
        assert (first.status, first.step) == ("interrupted", 12) and marker.exists()
        checkpoints = ledger.artifacts("loop")
        assert 12 in set(checkpoints[checkpoints["kind"] == "checkpoint"]["step"])
        second = execute(ledger, run_id, artifacts=tmp_path / "a", replay_in_subprocess=False)
        run = ledger.run(run_id)
        assert (run.status, run.stop_cause, run.stop_step) == ("completed", "budget_reached", 12)
        assert second.detail.startswith("12 of 12 updates done")
        steps, seen = _curve(ledger)
        assert steps == list(range(1, 13)) and seen == 12 * 2 * 4  # microbatch 4
        assert list(ledger.metrics("loop", keys=["val/accuracy"])["step"]) == [5, 10, 12]
        segments = ledger.segments("loop")
        assert list(segments["start_step"]) == [0, 12] and list(segments["end_step"]) == [12, 12]
        sheet = balance_sheet(ledger, "loop")
        assert "budget" not in str(sheet.runs["flags"].iloc[0])
        assert sheet.variants["n"].tolist() == [1]


def test_a_machine_lost_in_the_final_replay_completes_from_its_final_artifact(
    sqlite_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "killed"
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id = plan_loop(ledger, task=FAULTY, config={
            "task.fault": "sigkill_in_replay", "task.marker": str(marker)})[0]
    _killed_in_its_replay(sqlite_url, run_id, tmp_path / "a", marker, "lost in the replay")
    with Ledger.open(sqlite_url) as ledger:
        assert ledger.run(run_id).status == "running"  # nobody said anything
        finals = ledger.artifacts("loop").query("kind == 'final'")
        assert len(finals) == 1 and int(finals["step"].iloc[0]) == 12
        final = Path(finals["path"].iloc[0])
        recorded, bytes_before = finals["sha256"].iloc[0], final.read_bytes()
        ledger.finish(run_id, "lost", StopRecord("heartbeat_lost", None, None, "test"))
        outcome = execute(ledger, run_id, artifacts=tmp_path / "a", replay_in_subprocess=False)
        assert (outcome.status, outcome.step) == ("completed", 12)
        finals = ledger.artifacts("loop").query("kind == 'final'")
        assert len(finals) == 1  # written once: the resume completed from it
        assert final.read_bytes() == bytes_before and file_sha256(final) == recorded
        steps, seen = _curve(ledger)
        assert steps == list(range(1, 13)) and seen == 12 * 2 * 4
        assert ledger.segments("loop")["start_step"].tolist() == [0, 12]


def test_a_run_stopped_early_and_lost_while_ending_resumes_at_its_stop(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Early stopping ends the run at its second validation, update 4 of 12 (a rising
    ``val/loss`` is the goal under ``mode = "max"``, so a falling one never improves); the
    machine is lost in the final artifact's replay. The resume ends the run where it stopped,
    with the same decision, from the recorded final artifact: no update past the stop (its
    restored rules would let it train on to a later validation)."""
    marker = tmp_path / "killed"
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id = plan_loop(ledger, task=FAULTY, stop={"patience": 1},
                           validation={"every": 2, "metric": "val/loss"}, config={
            "task.fault": "sigkill_in_replay", "task.marker": str(marker)})[0]
    _killed_in_its_replay(sqlite_url, run_id, tmp_path / "a", marker, "a machine lost while ending")
    with Ledger.open(sqlite_url) as ledger:
        decided = ledger.events("loop", run_id=run_id).query("kind == 'stop_decided'")
        assert len(decided) == 1 and '"cause": "early_stop"' in decided["detail"].iloc[0]
        ledger.finish(run_id, "lost", StopRecord("heartbeat_lost", None, None, "test"))
        outcome = execute(ledger, run_id, artifacts=tmp_path / "a", replay_in_subprocess=False)
        run = ledger.run(run_id)
        assert (outcome.status, outcome.step) == ("stopped", 4)
        assert (run.status, run.stop_cause, run.stop_step) == ("stopped", "early_stop", 4)
        assert len(ledger.artifacts("loop").query("kind == 'final'")) == 1  # written once
        steps, seen = _curve(ledger)
        assert steps == [1, 2, 3, 4] and seen == 4 * 2 * 4
        assert list(ledger.metrics("loop", keys=["val/loss"])["step"]) == [2, 4]
        assert ledger.segments("loop")["start_step"].tolist() == [0, 4]
        again = ledger.events("loop", run_id=run_id).query("kind == 'stop_decided'")
        assert len(again) == 1  # the resumed segment took the recorded decision, not a new one


def test_an_older_run_past_its_budget_is_flagged_and_not_counted(ledger: Ledger) -> None:
    """What a ledger written before the fix holds: 7 of 6 updates. The run keeps its line
    and its value, flagged; its variant counts the seed without a value."""
    ledger.create_campaign(
        "old", question="q", task="campaign.tasks.digits:build",
        spec={"validation": {"metric": "val/accuracy", "mode": "max"}},
        variants=[NewVariant("control", True, {}), NewVariant("wide", False, {"w": 2})],
        runs=[NewRun(v, 0, {"budget": {"updates": 6}, "seed": 0})
              for v in ("control", "wide")],
    )
    for updates, value in ((6, 0.5), (7, 0.9)):
        claim = ledger.claim_next("old", "w")
        with ledger.metric_writer(claim.run_id, claim.segment_id) as writer:
            for step in range(1, updates + 1):
                writer.log("train/loss", step, 1.0 / step, examples_seen=4 * step)
            writer.log("val/accuracy", updates, value)
        ledger.finish(claim.run_id, "completed", StopRecord("budget_reached", updates, "update"))
    sheet = balance_sheet(ledger, "old")
    flags = sheet.flags[sheet.flags["kind"] == "budget_exceeded"]
    assert len(flags) == 1 and flags["detail"].iloc[0].startswith("7 updates done of 6")
    wide = sheet.variants.set_index("variant").loc["wide"]
    assert wide["n"] == 0 and wide["completed"] == 1
    assert "budget exceeded" in wide["missing"]["0"]
    assert sheet.deltas["delta"].isna().all()
