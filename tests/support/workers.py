"""Functions run in separate processes by the concurrency tests (module level, so that a
fork server can import them once)."""

from __future__ import annotations

import multiprocessing.synchronize
import traceback
from typing import Any

from campaign.ledger import Ledger


def write_metrics(
    url: str, run_id: str, segment_id: int, points: int, batch_size: int,
    read_every: int, start: multiprocessing.synchronize.Barrier, errors: Any,
) -> None:
    """Write ``points`` metric points in batches of ``batch_size``; read now and then."""
    try:
        ledger = Ledger.open(url, create=True)
        start.wait()
        with ledger.metric_writer(run_id, segment_id, batch_size=batch_size,
                                  interval_s=3600) as writer:
            for step in range(points):
                writer.log("train/loss", step, 1.0 / (step + 1), examples_seen=16 * step)
                if read_every and step % read_every == 0:
                    # Reads, and read-then-write transactions (the campaign is
                    # looked up, then the event inserted): the pattern that a
                    # deferred BEGIN turns into "database is locked".
                    ledger.metrics(runs=[run_id], keys=["train/loss"])
                    ledger.heartbeat(run_id)
                    ledger.add_event("stress", "progress", f"step {step}", run_id=run_id)
        ledger.close()
    except BaseException:
        errors.put(traceback.format_exc())
        raise


def open_fresh(url: str, start: multiprocessing.synchronize.Barrier, results: Any) -> None:
    """Open a ledger that does not exist yet, at the same moment as the others."""
    try:
        start.wait()
        with Ledger.open(url, create=True) as ledger:
            results.put(("ok", ledger.revision()))
    except BaseException:
        results.put(("error", traceback.format_exc()))
