"""The kernel's OOM killer, for real: a `campaign run` in a memory cgroup of this test's own
(3 GiB, no swap), a task that takes host memory until the kernel kills it. The run ends
`interrupted`/`killed`, its detail naming the OOM killer (the cgroup's oom_kill count grew)
beside the campaign pilot's host-memory peak, and its resume ends as its twin (docs/runs.md,
faults). Needs root and a memory cgroup (v1 or v2), as CI has."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from campaign.ledger import Ledger
from campaign.loop.train import execute
from tests.conftest import REQUIRE_ALL
from tests.support.launch_helpers import ROOT, cli, invoke, losses
from tests.support.loop_helpers import plan_loop

TASK = "tests.support.tasks.faulty:build"
HOLD = {"loop.checkpoint_every": 2}
LIMIT = 3 * 2**30  # the worker, its task host and the run's process with torch: ~1.5 GiB


def _memory_group() -> Path | None:
    """Where this process's memory cgroup lives (v1 controller, else v2), if writable."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    groups = dict(line.split(":", 2)[1:] for line in lines)
    if "memory" in groups:
        place = Path("/sys/fs/cgroup/memory") / groups["memory"].lstrip("/")
    elif "" in groups:
        place = Path("/sys/fs/cgroup") / groups[""].lstrip("/")
    else:
        return None
    return place if os.access(place, os.W_OK) else None


@pytest.fixture
def memory_group() -> Iterator[Path]:
    """A child memory cgroup with a LIMIT and no swap, removed afterwards."""
    parent = _memory_group()
    if parent is None:
        if REQUIRE_ALL:
            raise RuntimeError("CAMPAIGN_REQUIRE_ALL is set but no writable memory cgroup")
        pytest.skip("capability: no writable memory cgroup")
    group = parent / f"campaign-oom-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        v1 = (group / "memory.limit_in_bytes").exists()
        (group / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(str(LIMIT))
        swap = group / ("memory.memsw.limit_in_bytes" if v1 else "memory.swap.max")
        if swap.exists():
            swap.write_text(str(LIMIT) if v1 else "0")
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        subprocess.run(["rmdir", str(group)], check=False)


@pytest.mark.slow
def test_the_oom_killer_interrupts_a_run_and_names_itself_beside_the_pilots_peak(
        sqlite_ledger: Ledger, sqlite_url: str, memory_group: Path, tmp_path: Path) -> None:
    (twin,) = plan_loop(sqlite_ledger, "twin", task=TASK, hold=HOLD)
    execute(sqlite_ledger, twin, artifacts=tmp_path / "twin", replay_in_subprocess=False)
    (run_id,) = plan_loop(sqlite_ledger, "hog", task=TASK, hold=HOLD,
                          config={"task.fault": "hog", "task.at": 11,
                                  "task.marker": str(tmp_path / "hogged-once")})
    piloted = invoke(sqlite_url, "pilot", "hog")  # measures the host memory a run needs
    assert piloted.returncode == 0, piloted.stderr[-2000:]
    artifacts = str(tmp_path / "artifacts")
    command = cli(sqlite_url, "run", run_id, "--artifacts", artifacts, "--no-replay-check")
    inside = f'echo $$ > {memory_group / "cgroup.procs"} && exec "$@"'
    done = subprocess.run(["sh", "-c", inside, "sh", *command], cwd=ROOT, text=True,
                          capture_output=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "CAMPAIGN_TEST_HOG": "1"})
    assert done.returncode == 1, done.stderr[-3000:]
    record = sqlite_ledger.run(run_id)
    assert (record.status, record.stop_cause) == ("interrupted", "killed"), record
    assert "SIGKILL from the kernel's OOM killer" in record.stop_detail, record.stop_detail
    assert "its pilot's host-memory peak:" in record.stop_detail and " GiB" in record.stop_detail

    resumed = invoke(sqlite_url, "resume", run_id, "--artifacts", artifacts,
                     "--no-replay-check")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert losses(sqlite_ledger, run_id).equals(losses(sqlite_ledger, twin))
