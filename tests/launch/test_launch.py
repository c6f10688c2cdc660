"""The launcher: workers claiming runs from one ledger, exactly once, on both engines."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

from campaign.cli import main
from campaign.ledger import Ledger
from campaign.ledger.locality import filesystem_type, network_refusal
from tests.support.launch_helpers import ROOT, event_counts, invoke, last_step, start, wait_for
from tests.support.loop_helpers import plan_quick

SKIP = ("--skip-pilot", "--reason", "launcher test")


@pytest.mark.slow
def test_workers_execute_every_run_exactly_once(
    ledger: Ledger, ledger_url: str, tmp_path: Path
) -> None:
    """8 workers on PostgreSQL, 4 on SQLite, 100 planned runs: each runs once, none is left.
    The launcher runs in this process (its own process is not what is tested: its workers are
    real processes, and they join this process's task host as a launcher's workers do)."""
    workers = 8 if ledger.dialect == "postgresql" else 4
    run_ids = plan_quick(ledger, "many", runs=100, updates=2)
    done = invoke(
        ledger_url, "launch", "many", "--workers", str(workers), "--artifacts",
        str(tmp_path / "artifacts"), "--no-replay-check", *SKIP,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "many: 100/100 done (completed 100)" in done.stderr

    runs = ledger.runs("many")
    assert sorted(runs["run_id"]) == sorted(run_ids)
    assert set(runs["status"]) == {"completed"}
    counts = event_counts(ledger, "many")
    assert (counts["running"] == 1).all() and (counts["completed"] == 1).all()
    assert "resumed" not in counts and "lost" not in counts
    segments = ledger.segments("many")
    assert len(segments) == 100 and set(segments["ordinal"]) == {1}
    # Each run's segment was written by the worker that claimed it; work was shared out.
    assert (segments.set_index("run_id")["worker"] == runs.set_index("run_id")["worker"]).all()
    assert runs["worker"].nunique() > 1
    assert ledger.events("many")["detail"].str.contains("pilot skipped|launcher test").any()
    points = ledger.metrics("many", all_segments=True)
    assert not points.duplicated(["segment_id", "key", "step"]).any()
    assert len(points[points["key"] == "train/loss"]) == 200


def test_launch_refuses_without_a_passing_pilot(sqlite_ledger: Ledger, sqlite_url: str) -> None:
    ledger, ledger_url = sqlite_ledger, sqlite_url
    plan_quick(ledger, "gated", runs=2)
    # Refused before any worker starts: the command line in this process is enough.
    refused = CliRunner().invoke(main, ["--ledger", ledger_url, "launch", "gated"])
    assert refused.exit_code == 1
    assert "no passing pilot" in refused.stderr and "--skip-pilot --reason" in refused.stderr
    assert "Traceback" not in refused.stderr
    no_reason = CliRunner().invoke(
        main, ["--ledger", ledger_url, "launch", "gated", "--skip-pilot"]
    )
    assert no_reason.exit_code == 2 and "--reason" in no_reason.stderr
    assert set(ledger.runs("gated")["status"]) == {"planned"}  # nothing started
    assert "pilot_skipped" not in set(ledger.events("gated")["kind"])


@pytest.mark.slow
def test_sigterm_to_launch_interrupts_running_runs(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    """SIGTERM: running runs checkpoint and end interrupted, nothing is left running; a
    second launch with --resume-interrupted finishes them from their checkpoints.
    (Launcher behaviour; the lease tests cover both engines.)"""
    ledger, ledger_url = sqlite_ledger, sqlite_url
    plan_quick(ledger, "stop", runs=3, updates=60, task={"sleep_s": 0.02},
               hold={"loop.checkpoint_every": 5})
    artifacts = str(tmp_path / "artifacts")
    launch = start(ledger_url, "launch", "stop", "--workers", "2", "--artifacts", artifacts,
                   "--no-replay-check", *SKIP)

    def two_running_past_a_checkpoint() -> bool:
        running = ledger.runs("stop", status="running")["run_id"]
        return len(running) == 2 and all(last_step(ledger, r) >= 6 for r in running)

    wait_for(two_running_past_a_checkpoint, 120, "two runs past their first checkpoint")
    launch.send_signal(signal.SIGTERM)
    _, stderr = launch.communicate(timeout=120)
    assert launch.returncode == 1, stderr
    assert "--resume-interrupted" in stderr and "Traceback" not in stderr
    runs = ledger.runs("stop")
    assert "running" not in set(runs["status"])
    interrupted = runs[runs["status"] == "interrupted"]
    assert len(interrupted) == 2 and set(interrupted["stop_cause"]) == {"interrupted"}
    assert interrupted["stop_detail"].str.contains("SIGTERM").all()

    resumed = invoke(ledger_url, "launch", "stop", "--workers", "2", "--artifacts", artifacts,
                     "--no-replay-check", "--resume-interrupted")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    runs = ledger.runs("stop")
    assert set(runs["status"]) == {"completed"}
    segments = ledger.segments("stop")
    again = segments[segments["ordinal"] == 2]
    assert sorted(again["run_id"]) == sorted(interrupted["run_id"])
    assert (again["start_step"] > 0).all()  # continued from a checkpoint, not from scratch


@pytest.mark.slow
def test_a_worker_killed_under_launch_loses_its_run_at_once_and_is_replaced(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    """The launcher sees its worker process die: the run is declared lost at once (not after
    a lease of 600 s) and a new worker takes the remaining run."""
    ledger = sqlite_ledger
    # A checkpoint every 5 updates flushes the metrics: the run's progress is seen while it runs.
    plan_quick(ledger, "reaped", runs=2, updates=60, task={"sleep_s": 0.02},
               hold={"loop.checkpoint_every": 5})
    artifacts = str(tmp_path / "artifacts")
    launch = start(sqlite_url, "launch", "reaped", "--workers", "1", "--lease-s", "600",
                   "--artifacts", artifacts, "--no-replay-check", *SKIP)
    victim: list[str] = []

    def a_run_past_update_3() -> bool:
        if launch.poll() is not None:
            raise AssertionError(f"launch ended early: {launch.communicate()[1][-2000:]}")
        for row in ledger.runs("reaped", status="running").itertuples():
            if last_step(ledger, row.run_id) >= 3:
                victim[:] = [row.run_id, row.worker]
                return True
        return False

    wait_for(a_run_past_update_3, 120, "a run past update 3")
    run_id, worker = victim
    os.kill(int(worker.split(":")[1]), signal.SIGKILL)
    _, stderr = launch.communicate(timeout=180)
    assert launch.returncode == 1 and "1 lost" in stderr, stderr[-2000:]
    runs = ledger.runs("reaped").set_index("run_id")
    lost = runs.loc[run_id]
    assert (lost["status"], lost["stop_cause"]) == ("lost", "heartbeat_lost")
    assert "process ended without ending the run" in lost["stop_detail"]
    other = runs.drop(index=run_id).iloc[0]
    assert other["status"] == "completed"
    assert other["worker"] != worker  # a replacement worker ran it


def test_sqlite_ledger_refused_when_another_host_holds_a_live_run(
    sqlite_url: str, tmp_path: Path
) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        plan_quick(ledger, "shared", runs=2)
        ledger.claim_next("shared", "other-host:4242:cuda:0")
        before = len(ledger.events("shared"))
    refused = invoke(sqlite_url, "worker", "shared", "--artifacts", str(tmp_path), *SKIP)
    assert refused.returncode == 3
    assert "other-host" in refused.stderr and "PostgreSQL" in refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    with Ledger.open(sqlite_url, create=True) as ledger:
        assert len(ledger.events("shared")) == before  # nothing claimed, nothing recorded


def test_filesystem_type_of_a_path_from_proc_mounts() -> None:
    mounts = (
        "/dev/sda1 / ext4 rw 0 0\n"
        "server:/export /mnt/lab nfs4 rw,relatime 0 0\n"
        "/dev/sdb1 /mnt/lab/local xfs rw 0 0\n"
    )
    assert filesystem_type(Path("/mnt/lab/ledger.db"), mounts) == "nfs4"
    assert filesystem_type(Path("/mnt/lab/local/ledger.db"), mounts) == "xfs"
    assert filesystem_type(Path("/mnt/laboratory/ledger.db"), mounts) == "ext4"


def test_sqlite_ledger_on_a_network_filesystem_is_refused() -> None:
    mounts = "/dev/sda1 / ext4 rw 0 0\nserver:/export /mnt/lab nfs4 rw,relatime 0 0\n"
    refusal = network_refusal(Path("/mnt/lab/campaign.db"), mounts)
    assert refusal is not None
    assert "network filesystem (nfs4)" in refusal and "PostgreSQL" in refusal
    assert network_refusal(Path("/home/me/campaign.db"), mounts) is None
    # This machine's own filesystem, read from its /proc/mounts, is local: nothing refused.
    assert network_refusal(ROOT / "campaign.db", Path("/proc/mounts").read_text()) is None


def test_status_reads_the_campaign_from_the_ledger(ledger: Ledger, ledger_url: str) -> None:
    import io
    import json

    from click.testing import CliRunner

    from campaign.cli import main
    from campaign.launch.live_table import ProgressDisplay
    from campaign.ledger.progress import take_snapshot

    run_ids = plan_quick(ledger, "watched", runs=3, updates=4)
    claim = ledger.claim_next("watched", "elsewhere:7:cuda:1")
    with ledger.metric_writer(claim.run_id, claim.segment_id, lease=claim.lease) as metrics:
        for step in (1, 2):
            metrics.log("train/loss", step, 0.5)
    shown = CliRunner().invoke(main, ["--ledger", ledger_url, "status", "watched",
                                      "--format", "json"])
    assert shown.exit_code == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document["counts"]["planned"] == 2 and document["counts"]["running"] == 1
    assert document["left"] == 2 and document["done"] == 0 and document["eta_s"] is None
    (running,) = document["running"]
    assert running["run_id"] == claim.run_id and running["worker"] == "elsewhere:7:cuda:1"
    assert (running["step"], running["updates"]) == (2, 4)
    assert 0 <= running["heartbeat_age_s"] < 60

    table = CliRunner().invoke(main, ["--ledger", ledger_url, "status", "watched"])
    assert "watched: 0/3 done, 1 running, 2 left" in table.stdout
    assert claim.run_id in table.stdout and "elsewhere:7:cuda:1" in table.stdout

    # The same snapshot drives the launcher's display: plain lines in a pipe, only on change;
    # a live table on a terminal.
    snapshot = take_snapshot(ledger, "watched")
    pipe = io.StringIO()
    plain = ProgressDisplay(pipe, live=False)
    plain.show(snapshot)
    plain.show(snapshot)
    assert pipe.getvalue().count("\n") == 1 and "2 left" in pipe.getvalue()
    terminal = io.StringIO()
    live = ProgressDisplay(terminal, live=True)
    live.show(snapshot)
    live.close()
    assert claim.run_id in terminal.getvalue() and "2/4" in terminal.getvalue()
    assert claim.run_id == run_ids[0]  # the oldest planned run is claimed first


@pytest.mark.slow
def test_two_launchers_on_one_campaign_both_report_every_run_ended(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    """The launcher that runs out of work first waits for the other's runs to end: both exit 0
    (it used to exit 1 "runs left" while the other's last run was still training)."""
    run_ids = plan_quick(sqlite_ledger, "shared", runs=4, updates=30, task={"sleep_s": 0.02})
    launchers = [
        start(sqlite_url, "launch", "shared", "--workers", "1", "--artifacts",
              str(tmp_path / "artifacts"), "--no-replay-check", *SKIP)
        for _ in range(2)
    ]
    outputs = [launcher.communicate(timeout=300) for launcher in launchers]
    assert [launcher.returncode for launcher in launchers] == [0, 0], outputs
    runs = sqlite_ledger.runs("shared")
    assert set(runs["status"]) == {"completed"} and len(runs) == len(run_ids)
    assert runs["worker"].nunique() == 2  # the work was shared between the two launchers
