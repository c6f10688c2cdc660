"""The command line of a ``campaign worker`` that a launcher starts (a local process, a SLURM
array task). It never carries the ledger URL: the worker reads it from ``CAMPAIGN_LEDGER`` in
its environment, so a password never appears on a command line or in a batch script."""

from __future__ import annotations

import sys

from campaign.launch.worker import WorkerOptions


def worker_command(options: WorkerOptions, device: str, threads: int | None = None,
                   *extra: str) -> list[str]:
    """``python -m campaign worker CAMPAIGN --launched ...`` for ``options`` on ``device``."""
    o = options
    line = [
        sys.executable, "-m", "campaign", "worker", o.campaign,
        "--device", device, "--artifacts", str(o.artifacts.absolute()),
        "--heartbeat-s", f"{o.heartbeat_s:g}", "--lease-s", f"{o.lease_s:g}", "--launched",
        "--stop-grace-s", f"{o.grace_s:g}",
    ]
    if threads:
        line += ["--threads", str(threads)]
    for status in o.resume:
        line.append(f"--resume-{status}")
    if not o.replay_in_subprocess:
        line.append("--no-replay-check")
    return [*line, *extra]
