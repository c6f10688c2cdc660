"""Nothing waits for ever on a stopped task host: SIGSTOP of the host alone (not the job) left
`campaign run` waiting without end, since the host reports its children's ends. The
supervisor continues a host it finds stopped while it runs, as it does the run's process."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from campaign.host.processes import parent_pid, process_state
from campaign.ledger import Ledger
from tests.support.launch_helpers import last_step, start, wait_for
from tests.support.loop_helpers import plan_quick


def _children(pid: int) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and parent_pid(int(p)) == pid]


@pytest.mark.slow
def test_a_task_host_stopped_alone_is_continued_and_the_run_ends(sqlite_url: str,
                                                                tmp_path: Path) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        (run_id,) = plan_quick(ledger, "stopped", runs=1, updates=12, task={"sleep_s": 0.05})
    command = start(sqlite_url, "run", run_id, "--artifacts", str(tmp_path / "a"),
                    "--skip-pilot", "--reason", "a test of a stopped host")
    try:
        with Ledger.open(sqlite_url) as ledger:
            wait_for(lambda: last_step(ledger, run_id) >= 2, 120, "update 2 of the run")
        (host,) = [p for p in _children(command.pid)
                   if b"host_process" in Path(f"/proc/{p}/cmdline").read_bytes()]
        os.kill(host, signal.SIGSTOP)
        _, stderr = command.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        command.kill()
        raise AssertionError("`campaign run` waited on its stopped task host") from None
    finally:
        if command.poll() is None:
            command.kill()
    assert command.returncode == 0, stderr[-2000:]
    assert f"run {run_id}: completed" in stderr
    assert process_state(host) in (None, "Z")  # the host ended with its command
