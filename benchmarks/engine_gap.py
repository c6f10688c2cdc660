"""The per-run cost of each executor: the gap between two runs on one slot, and the time to the
first run's start, for `campaign launch --executor local|slurm|ray`.

    python benchmarks/engine_gap.py [--runs 8] [--executors local,slurm,ray]

Each executor launches the same campaign of tiny runs (2 updates, no replay check) with one
worker on a fresh PostgreSQL database. Read from the ledger: the gap between one segment's
end and the next segment's start on the same worker (the claim, the child's fork and the
run's set-up), and from the launch's own start to the first segment's start (interpreter,
engine and task host start-up). SLURM needs the cluster of scripts/slurm-cluster; Ray starts
a private instance.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import common  # noqa: F401  (puts the project on sys.path)
import psycopg

from campaign.ledger import Ledger
from tests.support.loop_helpers import plan_quick  # the suite's tiny planned runs

ROOT = Path(__file__).resolve().parents[1]
ADMIN = "postgresql://postgres@127.0.0.1:5432/test"


def one(executor: str, runs: int) -> tuple[float, float]:
    database = f"gap_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{database}"
    try:
        with Ledger.open(url, create=True) as ledger:
            plan_quick(ledger, "gap", runs=runs, updates=2)
        with tempfile.TemporaryDirectory(dir="/tmp") as folder:
            began = time.time()
            done = subprocess.run(
                [sys.executable, "-m", "campaign", "--ledger", url, "launch", "gap",
                 "--executor", executor, "--workers", "1", "--artifacts", folder,
                 "--no-replay-check", "--skip-pilot", "--reason", "benchmark"],
                cwd=ROOT, capture_output=True, text=True, timeout=900,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            assert done.returncode == 0, done.stderr[-2000:]
        with Ledger.open(url) as ledger:
            segments = ledger.segments("gap").sort_values("started_at")
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    gaps = []
    for _, mine in segments.groupby("worker"):
        starts, ends = list(mine["started_at"].iloc[1:]), list(mine["ended_at"].iloc[:-1])
        gaps += [(s - e).total_seconds() for s, e in zip(starts, ends, strict=True)]
    first = segments["started_at"].iloc[0].timestamp() - began
    return statistics.median(gaps), first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--executors", default="local,slurm,ray")
    args = parser.parse_args()
    print(f"{args.runs} runs of 2 updates, one worker; median gap between two runs on it, "
          "and the launch's start to the first run's start")
    results = {}
    for executor in args.executors.split(","):
        results[executor] = one(executor, args.runs)
    local = results.get("local", (None, None))[0]
    for executor, (gap, first) in results.items():
        ratio = f"  ({gap / local:.2f}x local)" if local else ""
        print(f"  {executor:<6} gap {gap * 1000:7.0f} ms{ratio}   first run after {first:5.1f} s")


if __name__ == "__main__":
    main()
