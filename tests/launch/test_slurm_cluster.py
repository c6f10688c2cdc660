"""SLURM for real: the single-node cluster `scripts/test-services` starts (Debian's slurm-wlm
and munge, JobRequeue=1, no accounting), jobs submitted by `campaign launch --executor slurm`
through the real `sbatch`, signals sent with the real `scancel`, as a scheduler sends them to
every process of a job step.

Each launch is an array of `campaign worker` tasks that claim runs from a PostgreSQL ledger
whose URL carries a password (trust authentication accepts any): the password must appear in
no file under the artifacts and job folders and on no command line."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import psutil
import pytest

from campaign.ledger import Ledger
from campaign.loop.train import execute
from tests.conftest import REQUIRE_ALL
from tests.support.engine_helpers import checkpoint_steps, no_secret_in, running_past, with_password
from tests.support.launch_helpers import ROOT, invoke, last_step, losses, run, wait_for
from tests.support.loop_helpers import plan_quick
from tests.support.outages import (
    GAUNTLET_UPDATES,
    Bouncer,
    Cluster,
    gauntlet,
    ridden_out,
)

pytestmark = pytest.mark.engine

if shutil.which("sbatch") is None and not REQUIRE_ALL:
    pytest.skip("capability: no SLURM cluster (scripts/test-services starts one)",
                allow_module_level=True)

SLOW = {"task": {"sleep_s": 0.03}, "hold": {"loop.checkpoint_every": 5}, "validation_every": 3}
FAST_LEASE = ("--heartbeat-s", "0.5", "--lease-s", "5")


@pytest.fixture
def cluster() -> Iterator[list[str]]:
    """The running test cluster; the campaigns a test names are cancelled after it."""
    state = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, check=False)
    assert state.returncode == 0 and state.stdout.strip(), (
        f"no SLURM cluster answers (scripts/test-services starts one): {state.stderr.strip()}"
    )
    names: list[str] = []
    yield names
    for name in names:
        subprocess.run(["scancel", "--name", f"campaign:{name}"], check=False)


def _launch(url: str, campaign: str, artifacts: Path, *extra: str) -> subprocess.Popen[str]:
    """`campaign launch --executor slurm`, the URL (with its password) in the environment."""
    env = {**os.environ, "CAMPAIGN_LEDGER": with_password(url), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "campaign", "launch", campaign, "--executor", "slurm",
               "--skip-pilot", "--reason", "slurm test", "--artifacts", str(artifacts),
               *FAST_LEASE, "--no-replay-check", *extra]
    return subprocess.Popen(command, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _tasks(campaign: str) -> dict[str, str]:
    """``{job id of the task: state}`` for the array named ``campaign:NAME``."""
    out = subprocess.run(["squeue", "-h", "-r", "--name", f"campaign:{campaign}", "-o", "%A|%T"],
                         capture_output=True, text=True, check=True).stdout
    return dict(line.split("|") for line in out.split())


def _slurm_job_of(worker: str) -> str:
    """The SLURM id of one array task (``ARRAY_TASK``) of the process named in a run's worker
    column. Not its SLURM_JOB_ID: the first task's equals the array's own id, and scancel
    given it signals every task of the array (two runs preempted at once, seen under load)."""
    pid = int(worker.split(":")[1])
    environment = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
    values = dict(item.decode().split("=", 1) for item in environment if b"=" in item)
    if "SLURM_ARRAY_JOB_ID" in values:
        return f"{values['SLURM_ARRAY_JOB_ID']}_{values['SLURM_ARRAY_TASK_ID']}"
    return values["SLURM_JOB_ID"]


def _release_requeued(campaign: str) -> bool:
    """SLURM holds a requeued batch job about two minutes before it may start again; a
    test does not wait for that: a pending task is made eligible now."""
    for job, state in _tasks(campaign).items():
        if state == "PENDING":
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=False)
    return False


@pytest.mark.slow
def test_an_array_of_workers_is_preempted_requeued_and_ends_exactly_as_uninterrupted(
    postgresql_url: str, tmp_path: Path, cluster: list[str]
) -> None:
    cluster.append("sl-preempt")
    with Ledger.open(postgresql_url, create=True) as ledger:
        references = plan_quick(ledger, "sl-reference", runs=3, updates=40, **SLOW)
        for reference in references:
            execute(ledger, reference, artifacts=tmp_path / "reference", replay_in_subprocess=False)
        run_ids = plan_quick(ledger, "sl-preempt", runs=3, updates=40, **SLOW)
        launch = _launch(postgresql_url, "sl-preempt", tmp_path / "art", "--workers", "2")
        found: list[tuple[str, str]] = []
        wait_for(lambda: bool(found.extend(running_past(ledger, "sl-preempt", 7)) or found),
                 240, "a run past update 7 in an array task")
        assert set(_tasks("sl-preempt").values()) <= {"RUNNING", "PENDING"}
        no_secret_in(tmp_path / "art")  # while the array runs: logs, script, ps
        victim, worker = found[0]
        job = _slurm_job_of(worker)
        subprocess.run(["scancel", "--signal=USR2", job], check=True)

        wait_for(lambda: ledger.run(victim).status != "running", 120, "the preempted run's end")
        record = ledger.run(victim)
        assert (record.status, record.stop_cause) == ("interrupted", "preempted"), record
        assert "killed" not in str(record.stop_detail) and "SIGUSR2" in str(record.stop_detail)
        assert record.stop_step in checkpoint_steps(ledger, "sl-preempt", victim)
        wait_for(lambda: _release_requeued("sl-preempt") or launch.poll() is not None, 400,
                 "the launcher's end", every=2)
        _, stderr = launch.communicate(timeout=60)
        assert launch.returncode == 0, stderr[-3000:]

        runs = ledger.runs("sl-preempt").set_index("run_id")
        assert (runs["status"] == "completed").all(), runs["status"]
        segments = ledger.segments("sl-preempt")
        assert len(segments[segments["run_id"] == victim]) == 2
        assert int(segments[segments["run_id"] == victim]["start_step"].max()) == record.stop_step
        by_seed = ledger.runs("sl-reference").set_index("seed")["run_id"]
        for run_id in run_ids:
            reference = by_seed[runs.loc[run_id, "seed"]]
            assert losses(ledger, run_id).equals(losses(ledger, reference)), run_id
        # One worker per array task, several runs each: no job per run (3 runs and a resumed
        # segment on the two tasks and the requeued one).
        assert segments["worker"].value_counts().max() >= 2
    assert (tmp_path / "art" / "slurm").stat().st_mode & 0o777 == 0o700
    no_secret_in(tmp_path / "art")
    assert "Traceback" not in stderr


@pytest.mark.slow
def test_scancel_interrupts_with_a_checkpoint_at_the_stop_update(
    postgresql_url: str, tmp_path: Path, cluster: list[str]
) -> None:
    cluster.append("sl-cancel")
    with Ledger.open(postgresql_url, create=True) as ledger:
        (run_id,) = plan_quick(ledger, "sl-cancel", runs=1, updates=400, **SLOW)
        launch = _launch(postgresql_url, "sl-cancel", tmp_path / "art")
        wait_for(lambda: last_step(ledger, run_id) >= 7, 240, "update 7 in the array task")
        subprocess.run(["scancel", "--name", "campaign:sl-cancel"], check=True)
        _, stderr = launch.communicate(timeout=120)
        assert launch.returncode == 1, stderr[-3000:]  # an interrupted run needs attention
        record = ledger.run(run_id)
        assert (record.status, record.stop_cause) == ("interrupted", "interrupted"), record
        assert "SIGTERM" in str(record.stop_detail) and "killed" not in str(record.stop_detail)
        assert record.stop_step in checkpoint_steps(ledger, "sl-cancel", run_id)
        assert record.stop_step < 400
        assert "1 interrupted" in stderr and "Traceback" not in stderr
        assert "stopped by SIGTERM" in stderr and "error" not in stderr.lower(), stderr


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_every_task_with_checkpoints(
    postgresql_url: str, tmp_path: Path, cluster: list[str]
) -> None:
    cluster.append("sl-stop")
    with Ledger.open(postgresql_url, create=True) as ledger:
        run_ids = plan_quick(ledger, "sl-stop", runs=3, updates=400, **SLOW)
        launch = _launch(postgresql_url, "sl-stop", tmp_path / "art", "--workers", "2")
        wait_for(lambda: len(running_past(ledger, "sl-stop", 4)) == 2, 240,
                 "two runs past update 4")
        launch.send_signal(signal.SIGTERM)
        _, stderr = launch.communicate(timeout=120)
        assert launch.returncode == 1, stderr[-3000:]
        assert "launch interrupted" in stderr and "Traceback" not in stderr
        runs = ledger.runs("sl-stop").set_index("run_id")
        stopped = runs[runs["status"] == "interrupted"]
        assert len(stopped) == 2 and (runs.loc[run_ids, "status"] != "running").all()
        for run_id, row in stopped.iterrows():
            assert row["stop_cause"] == "interrupted"
            assert row["stop_step"] in checkpoint_steps(ledger, "sl-stop", str(run_id))
        assert (runs["status"] == "planned").sum() == 1  # the third never started
    assert _tasks("sl-stop") == {}  # nothing queued or running is left behind


@pytest.mark.slow
def test_a_killed_step_is_lost_then_resumed_by_a_live_array_task(
    postgresql_url: str, tmp_path: Path, cluster: list[str]
) -> None:
    cluster.append("sl-crash")
    with Ledger.open(postgresql_url, create=True) as ledger:
        plan_quick(ledger, "sl-crash", runs=3, updates=60, **SLOW)
        launch = _launch(postgresql_url, "sl-crash", tmp_path / "art", "--workers", "2",
                         "--resume-lost")
        found: list[tuple[str, str]] = []
        wait_for(lambda: bool(found.extend(running_past(ledger, "sl-crash", 7)) or found),
                 240, "a run past update 7")
        victim, worker = found[0]
        step = psutil.Process(int(worker.split(":")[1]))
        for process in [step, *step.children(recursive=True)]:  # a node crash: no handler runs
            try:
                process.kill()
            except psutil.NoSuchProcess:
                continue
        _, stderr = launch.communicate(timeout=400)
        assert launch.returncode == 0, stderr[-3000:]
        assert "killed by SIGKILL" in stderr, stderr  # the task is named, not silent
        runs = ledger.runs("sl-crash").set_index("run_id")
        assert (runs["status"] == "completed").all(), runs["status"]
        events = ledger.events("sl-crash", victim)
        assert {"lost", "resumed"} <= set(events["kind"])
        segments = ledger.segments("sl-crash")
        mine = segments[segments["run_id"] == victim]
        assert len(mine) == 2 and mine["worker"].nunique() == 2


@pytest.mark.slow
def test_past_its_requeues_a_preempted_run_stays_interrupted_and_resumable(
    postgresql_url: str, tmp_path: Path, cluster: list[str]
) -> None:
    cluster.append("sl-limit")
    with Ledger.open(postgresql_url, create=True) as ledger:
        (run_id,) = plan_quick(ledger, "sl-limit", runs=1, updates=120, **SLOW)
        launch = _launch(postgresql_url, "sl-limit", tmp_path / "art", "--max-requeues", "0")
        wait_for(lambda: last_step(ledger, run_id) >= 7, 240, "update 7")
        subprocess.run(["scancel", "--signal=USR2", "--name", "campaign:sl-limit"], check=True)
        _, stderr = launch.communicate(timeout=120)
        assert launch.returncode == 1, stderr[-3000:]
        record = ledger.run(run_id)
        assert (record.status, record.stop_cause) == ("interrupted", "preempted")
        assert len(ledger.segments("sl-limit")) == 1
        logs = "".join(p.read_text() for p in (tmp_path / "art" / "slurm").glob("*.log"))
        assert "used its 0 requeue(s)" in logs
        resumed = invoke(postgresql_url, "resume", run_id, "--artifacts", str(tmp_path / "art"))
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert ledger.run(run_id).status == "completed"


def test_without_slurm_the_executor_says_so(sqlite_url: str, tmp_path: Path) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        plan_quick(ledger, "no-slurm", runs=1)
    env = {**os.environ, "PATH": "/nonexistent", "CAMPAIGN_LEDGER": sqlite_url}
    refused = subprocess.run(
        [sys.executable, "-m", "campaign", "launch", "no-slurm", "--executor", "slurm",
         "--skip-pilot", "--reason", "test", "--artifacts", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert refused.returncode == 2
    assert "no SLURM on this machine" in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.slow
def test_the_time_limit_warning_is_a_preemption(
    postgresql_url: str, tmp_path: Path, cluster: list[str]
) -> None:
    """--slurm-time-min 3 with the warning 100 s ahead: SLURM itself sends SIGUSR2 20 to 80 s
    in (it may signal up to 60 s early: the resolution of its time-limit checks), after the
    worker started its run; with no requeue left the run stays preempted."""
    cluster.append("sl-limit-time")
    with Ledger.open(postgresql_url, create=True) as ledger:
        (run_id,) = plan_quick(ledger, "sl-limit-time", runs=1, updates=5000, **SLOW)
        launch = _launch(postgresql_url, "sl-limit-time", tmp_path / "art", "--slurm-time-min",
                         "3", "--slurm-signal-s", "100", "--max-requeues", "0")
        _, stderr = launch.communicate(timeout=240)
        assert launch.returncode == 1, stderr[-3000:]
        record = ledger.run(run_id)
        assert (record.status, record.stop_cause) == ("interrupted", "preempted"), record
        assert "SIGUSR2" in str(record.stop_detail) and "killed" not in str(record.stop_detail)
        assert record.stop_step in checkpoint_steps(ledger, "sl-limit-time", run_id)
        assert 0 < record.stop_step < 5000


@pytest.mark.slow
def test_an_array_and_its_launcher_ride_out_every_kind_of_ledger_outage(
    cluster: list[str], private_cluster: Cluster, private_bouncer: Bouncer, tmp_path: Path
) -> None:
    """Under an array task training a run and the launcher following it, through a PgBouncer:
    the ledger's sessions are killed, the PgBouncer restarts, the server restarts, then
    crashes (tests/support/outages.py gauntlet). Neither exits; the run ends as its twin,
    every point once (docs/runs.md, faults)."""
    cluster.append("blinks")
    ridden_out(private_bouncer.url, tmp_path, gauntlet(private_cluster, private_bouncer),
               ("launch", "blinks", "--executor", "slurm", "--workers", "1"),
               updates=GAUNTLET_UPDATES)


@pytest.mark.slow
def test_a_task_the_ledger_left_past_the_limit_is_requeued_and_its_run_resumed(
    cluster: list[str], private_cluster: Cluster, tmp_path: Path
) -> None:
    """The ledger's server stops for 25 s, past a 5 s CAMPAIGN_LEDGER_OUTAGE_S: the array task
    gives up, and goes back in the queue as a preempted one does; once the server is back the
    requeued task writes the end the run left (`ledger_unreachable`), resumes it first, and it
    ends as its twin."""
    cluster.append("outlived")
    url = private_cluster.url
    with Ledger.open(url, create=True) as ledger:
        (twin,) = plan_quick(ledger, "twin", runs=1, updates=40, **SLOW)
        execute(ledger, twin, artifacts=tmp_path / "twin", replay_in_subprocess=False)
        (run_id,) = plan_quick(ledger, "outlived", runs=1, updates=40, **SLOW)
        environment = {**os.environ, "CAMPAIGN_LEDGER_OUTAGE_S": "5", "OMP_NUM_THREADS": "1"}
        art = tmp_path / "art"
        launch = subprocess.Popen(
            [sys.executable, "-m", "campaign", "--ledger", url, "launch", "outlived",
             "--executor", "slurm", "--workers", "1", "--resume-lost", "--skip-pilot",
             "--reason", "slurm test", "--artifacts", str(art), *FAST_LEASE,
             "--no-replay-check"], cwd=ROOT, env=environment, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_for(lambda: last_step(ledger, run_id) >= 5, 240, "update 5 in the array task")
        private_cluster.ctl("stop", "-m", "fast")
        logs = sorted((art / "slurm").glob("*_0.log"))
        try:
            wait_for(lambda: "requeueing" in logs[0].read_text(), 120, "the task to requeue itself")
        except AssertionError as late:  # what the task said, and the queue: why it did not
            queue = subprocess.run(["squeue", "-a", "-r"], capture_output=True, text=True)
            raise AssertionError(f"{late}\n{logs[0].read_text()[-4000:]}\n{queue.stdout}"
                                 ) from None
        # The launcher gives up on the ledger too (the server stays down until it has: a
        # launcher that happened not to ask while it was down would rightly ride it out).
        _, stderr = launch.communicate(timeout=120)
        assert launch.returncode == 3, stderr[-3000:]
        private_cluster.ctl("start")
        assert "the ledger is unreachable; requeueing SLURM task" in logs[0].read_text()
        wait_for(lambda: _release_requeued("outlived") or ledger.run(run_id).status == "completed",
                 400, "the requeued task to complete the run", every=2)
        assert losses(ledger, run_id).equals(losses(ledger, twin))
        events = ledger.events("outlived", run_id)
        kinds = set(events["kind"])  # ended by the outage (or lost, if a sweep came first)
        assert "resumed" in kinds and ("lost" in kinds or any(
            "ledger_unreachable" in str(d) for d in events["detail"])), events


# A run's ranks on SLURM: a sharded run of 2 ranks as an array task of 2 SLURM tasks, rank 0 in
# the worker's step and rank 1 a step of its own; the preemption warning to the array task
# reaches both, the whole run checkpoints, is requeued and resumes, and its series equals the
# same run's on local ranks.
SHARDED = {"loop.replicas": 2, "loop.strategy": "fsdp", "loop.accumulation": 1,
           "loop.checkpoint_every": 5}


@pytest.mark.slow
def test_a_sharded_runs_ranks_are_slurm_tasks_and_a_preemption_checkpoints_them_all(
    postgresql_url: str, tmp_path: Path, cluster: list[str]
) -> None:
    cluster.append("sl-ranks")
    with Ledger.open(postgresql_url, create=True) as ledger:
        (reference,) = plan_quick(ledger, "sl-ranks-local", runs=1, updates=40,
                                  task={"sleep_s": 0.03}, hold=SHARDED, validation_every=10)
        (run_id,) = plan_quick(ledger, "sl-ranks", runs=1, updates=40,
                               task={"sleep_s": 0.03}, hold=SHARDED, validation_every=10)
    local = run(postgresql_url, "worker", "sl-ranks-local", "--artifacts", str(tmp_path / "l"),
                "--skip-pilot", "--reason", "reference", "--no-replay-check")
    assert local.returncode == 0, local.stderr[-2000:]
    launch = _launch(postgresql_url, "sl-ranks", tmp_path / "art", "--workers", "1")
    with Ledger.open(postgresql_url) as ledger:
        found: list[tuple[str, str]] = []
        wait_for(lambda: bool(found.extend(running_past(ledger, "sl-ranks", 7)) or found),
                 240, "the sharded run past update 7 in its array task")
        script = next((tmp_path / "art" / "slurm").glob("*.sbatch")).read_text()
        assert "#SBATCH --ntasks=2" in script
        subprocess.run(["scancel", "--signal=USR2", _slurm_job_of(found[0][1])], check=True)
        wait_for(lambda: ledger.run(run_id).status != "running", 120, "the preempted run's end")
        record = ledger.run(run_id)
        assert (record.status, record.stop_cause) == ("interrupted", "preempted"), (
            record.stop_detail)
        assert record.stop_step in checkpoint_steps(ledger, "sl-ranks", run_id)
        wait_for(lambda: _release_requeued("sl-ranks") or launch.poll() is not None, 400,
                 "the launcher's end", every=2)
        _, stderr = launch.communicate(timeout=60)
        said = "".join(p.read_text() for p in (tmp_path / "art" / "slurm").glob("*.log"))
        assert launch.returncode == 0, f"{stderr[-3000:]}\n--- the task's log:\n{said[-3000:]}"
        assert ledger.run(run_id).status == "completed"
        assert len(ledger.segments("sl-ranks")) == 2
        pd.testing.assert_series_equal(losses(ledger, run_id), losses(ledger, reference),
                                       check_exact=False, rtol=1e-9, atol=0)
        logs = ledger.artifacts("sl-ranks").query("kind == 'log'")["path"]
        text = "".join(Path(p).read_text() for p in logs)
        assert text.count(f"run {run_id}: ranks 1..1 as a SLURM step of job") == 2, text[-2000:]
        checkpoint = Path(ledger.artifacts("sl-ranks").query("kind == 'checkpoint'")
                          .sort_values("step")["path"].iloc[-1])
        assert checkpoint.with_name(checkpoint.stem + ".rank-1.safetensors").is_file()


def test_a_step_whose_rank_was_killed_is_a_lost_rank_and_one_that_failed_is_not() -> None:
    """srun says a task killed by signal N as its exit status 128 + N: rank 0 reads that as a
    rank lost (the run ends interrupted/killed), an exit of its own as the run's failure."""
    from campaign.launch.replicated import Followers

    def step(script: str) -> Followers:
        process = subprocess.Popen(["srun", "--ntasks=1", "--job-name=campaign:sl-step",
                                    "bash", "-c", script])
        followers = Followers([("ranks 1..1 (SLURM step)", process)], srun=True)
        process.wait(timeout=120)
        return followers

    killed = step("kill -9 $$").lost(wait_s=1)
    assert killed == "ranks 1..1 (SLURM step): a task was killed by SIGKILL", killed
    assert step("exit 3").lost(wait_s=1) is None
    assert step("kill -SEGV $$").lost(wait_s=1) is None  # a crash of its own
