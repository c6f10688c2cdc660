"""Scheduling overhead of the launcher: 50 runs through it vs the same 50 loops called directly.

    python benchmarks/launch.py [--runs 50] [--workers 4] [--postgres URL]

Three ways to execute the same planned runs of a trivial task (a 64x64x10
MLP, 2 updates, no replay check), each on a fresh campaign:

- direct: ``execute()`` of each run, one after the other, in this process
  (the loop's own ledger writes included: start, metrics, artifacts, end);
- worker: ``run_worker`` in this process (adds the protocol: sweep for lost
  runs, atomic claim, lease-checked writes, heartbeat thread);
- launch: ``campaign launch --workers N`` (adds worker processes, their
  start-up, the launcher's sweeps and progress display).

The per-run cost of claiming, recording and ending a run is the difference
to direct, printed in milliseconds and as a share of a 10-second run. For the
launch, the difference is taken against the ideal wall time of the direct
work spread over min(N, cores) processes, and multiplied back by that
parallelism: CPU-time per run, worker start-up amortised over the runs.
Goal: under 1% of a 10-second run (100 ms) with 4 workers on SQLite and on
PostgreSQL.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import common  # noqa: F401  (puts the project on sys.path)
import psycopg

from campaign.launch.worker import WorkerOptions, run_worker
from campaign.ledger import Ledger
from campaign.loop.train import execute
from campaign.plan import make_plan, record_plan
from campaign.spec import resolve_spec

ROOT = Path(__file__).resolve().parents[1]
RUN_SECONDS = 10.0


def spec(name: str, runs: int) -> dict:
    return {
        "campaign": {"name": name, "question": "launcher overhead",
                     "task": "benchmarks.overhead_task:build"},
        "hold": {"loop.microbatch": 8, "loop.accumulation": 1, "budget.updates": 2},
        "config": {"optimizer.name": "sgd", "optimizer.lr": 0.01, "task.model": "tiny",
                   "task.size": 64},
        "validation": {"every": 2, "metric": "val/accuracy", "mode": "max"},
        "grid": {"seeds": list(range(runs)), "control": "only", "variants": [{"name": "only"}]},
    }  # fmt: skip


def plan(ledger: Ledger, name: str, runs: int) -> list[str]:
    record, _ = record_plan(ledger, make_plan(resolve_spec(spec(name, runs), f"<{name}>")))
    return list(record.run_ids)


def measure(url: str, runs: int, workers: int, folder: Path) -> dict[str, float]:
    times = {}
    with Ledger.open(url) as ledger:
        ids = plan(ledger, "direct", runs)
        began = time.perf_counter()
        for run_id in ids:
            execute(ledger, run_id, artifacts=folder / "direct", replay_in_subprocess=False)
        times["direct"] = time.perf_counter() - began

        plan(ledger, "worker", runs)
        began = time.perf_counter()
        report = run_worker(ledger, WorkerOptions("worker", folder / "worker",
                                                  replay_in_subprocess=False))  # fmt: skip
        times["worker"] = time.perf_counter() - began
        assert len(report.outcomes) == runs

        plan(ledger, "launch", runs)
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "campaign", "--ledger", url, "launch", "launch", "--workers",
         str(workers), "--artifacts", str(folder / "launch"), "--no-replay-check",
         "--skip-pilot", "--reason", "benchmark"],
        cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    times["launch"] = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"launch failed: {done.stderr[-2000:]}")
    return times


def show(engine: str, times: dict[str, float], runs: int, workers: int) -> None:
    parallel = min(workers, os.cpu_count() or 1)
    direct = times["direct"]
    worker_ms = (times["worker"] - direct) / runs * 1000
    launch_ms = (times["launch"] - direct / parallel) * parallel / runs * 1000
    print(f"\n{engine}: {runs} runs, direct {direct / runs * 1000:.0f} ms a run")
    print(f"  worker protocol in-process : {times['worker']:7.2f} s  "
          f"overhead {worker_ms:7.1f} ms/run = {worker_ms / 10 / RUN_SECONDS:6.3f}% of a 10 s run")
    print(f"  launch --workers {workers} ({parallel} cores): {times['launch']:7.2f} s  "
          f"overhead {launch_ms:7.1f} ms/run = {launch_ms / 10 / RUN_SECONDS:6.3f}% of a 10 s run "
          f"(worker start-up amortised over {runs} runs)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test",
                        help="an admin URL; a scratch database is created and dropped")  # fmt: skip
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="campaign-launch-bench-"))
    os.chdir(ROOT)
    show("SQLite", measure(f"sqlite:///{folder / 'ledger.db'}", args.runs, args.workers,
                           folder / "sqlite"), args.runs, args.workers)  # fmt: skip
    name = f"campaign_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.postgres, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = args.postgres.rsplit("/", 1)[0] + f"/{name}"
        show("PostgreSQL", measure(url, args.runs, args.workers, folder / "pg"),
             args.runs, args.workers)  # fmt: skip
    finally:
        with psycopg.connect(args.postgres, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
