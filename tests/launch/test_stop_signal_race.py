"""A stop signal is never lost (docs/processes.md): a SLURM array task's worker preempted
(SIGUSR2) at a random moment of its claim cycle (between two runs, while claiming, while its
run's process starts and before that process has its handlers) trains no run past the signal:
the update under way finishes, then every run stops. Before, a signal that reached a run's
process before its handlers were installed was ignored, and the run trained to its end.
The signal the supervisor forwards is now also written on the run's progress page, read when
the run installs its handlers. Real worker processes on SQLite, seeded random moments."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from campaign.ledger import Ledger
from tests.support.launch_helpers import start, wait_for
from tests.support.loop_helpers import plan_quick

UPDATES = 12
SLACK_S = 0.3  # the signal's delivery and the update under way


@pytest.mark.slow
def test_a_preemption_at_any_moment_of_the_claim_cycle_stops_every_run(
        tmp_path: Path) -> None:
    moments = random.Random(20261205)
    for attempt in range(4):
        url = f"sqlite:///{tmp_path / f'ledger-{attempt}.db'}"
        with Ledger.open(url, create=True) as ledger:
            plan_quick(ledger, "race", runs=6, updates=UPDATES, task={"sleep_s": 0.01})
        worker = start(url, "worker", "race", "--slurm", "--artifacts",
                       str(tmp_path / f"a-{attempt}"), "--no-replay-check", "--skip-pilot",
                       "--reason", "a test of stop signals")
        with Ledger.open(url) as ledger:
            wait_for(lambda: (ledger.runs("race")["status"] != "planned").any(), 120,
                     "the first claim")
            time.sleep(moments.uniform(0.0, 1.5))
            signalled = time.time()
            os.kill(worker.pid, signal.SIGUSR2)
            _, stderr = worker.communicate(timeout=120)
            points = ledger.metrics("race", keys=["train/loss"], all_segments=True)
            runs = ledger.runs("race")
        late = points[points["wall_time"] > signalled + SLACK_S]
        per_run = late.groupby("run_id")["step"].count()
        assert (per_run <= 1).all(), (attempt, per_run.to_dict(), stderr[-2000:])
        assert set(runs["status"]) <= {"completed", "interrupted", "planned"}, runs["status"]


def test_a_stop_sent_before_the_run_had_handlers_is_read_from_its_page(tmp_path: Path) -> None:
    """The window itself, deterministically: the supervisor wrote the preemption on the run's
    page and signalled while the new process still ignored the signal (it inherits its task
    host's dispositions until it sets its own); the run's handlers, once installed, act on it."""
    from campaign.loop import progress_page
    from campaign.loop.signals import SignalLatch

    board = progress_page.ProgressBoard(tmp_path / "page", create=True)
    board.request_stop(signal.SIGUSR2)  # the supervisor: on the page, then the signal (lost)
    progress_page.install(progress_page.ProgressBoard(tmp_path / "page"))  # the run's side
    latch = SignalLatch(preempt_signals=(signal.SIGUSR2,))
    try:
        latch.install()
        assert latch.received == signal.SIGUSR2 and latch.preempted
        assert latch.decision().cause == "preempted"
    finally:
        latch.restore()
        progress_page.install(None)
