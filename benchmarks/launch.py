"""Scheduling overhead of the launcher: 50 runs through it vs the same 50 loops called directly.

    python benchmarks/launch.py [--runs 50] [--workers 4] [--postgres URL]

Three ways to execute the same planned runs of a trivial task (a 64x64x10
MLP, 2 updates, no replay check), each on a fresh campaign:

- direct: ``execute()`` of each run, one after the other, in this process
  (the loop's own ledger writes included: start, metrics, artifacts, end);
- worker: ``run_worker`` in this process (adds the protocol: sweep for lost
  runs, atomic claim, lease-checked writes, heartbeat thread);
- process: one ``campaign worker`` process (the production path: each run in
  a supervised child forked from the worker; its cost per run is read from the
  ledger's timestamps, run start to the next run's start, so the worker's own
  start-up does not enter);
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
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import common  # noqa: F401  (puts the project on sys.path)
import numpy as np
import psycopg

from campaign.launch.worker import WorkerOptions, run_worker
from campaign.ledger import Ledger
from campaign.loop.train import execute
from campaign.plan.grid import make_plan, record_plan
from campaign.plan.spec import resolve_spec

ROOT = Path(__file__).resolve().parents[1]


def spec(name: str, runs: int) -> dict:
    return {
        "campaign": {"name": name, "question": "launcher overhead",
                     "task": "benchmarks.overhead_task:build"},
        "hold": {"loop.microbatch": 8, "loop.accumulation": 1, "budget.updates": 2},
        "config": {"optimizer.name": "sgd", "optimizer.lr": 0.01, "task.model": "tiny",
                   "task.size": 64},
        "validation": {"every": 2, "metric": "val/accuracy", "mode": "max"},
        "grid": {"seeds": list(range(runs)), "control": "only", "variants": [{"name": "only"}]},
    }


def plan(ledger: Ledger, name: str, runs: int) -> list[str]:
    record, _ = record_plan(ledger, make_plan(resolve_spec(spec(name, runs), f"<{name}>")))
    return list(record.run_ids)


def direct(ledger: Ledger, name: str, folder: Path) -> None:
    for run_id in ledger.campaign(name).run_ids:
        execute(ledger, run_id, artifacts=folder / name, replay_in_subprocess=False)


def worker(ledger: Ledger, name: str, folder: Path) -> None:
    report = run_worker(ledger, WorkerOptions(name, folder / name, replay_in_subprocess=False))
    assert report.outcomes


def launch(url: str, name: str, workers: int, folder: Path) -> float:
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "campaign", "--ledger", url, "launch", name, "--workers",
         str(workers), "--artifacts", str(folder / name), "--no-replay-check",
         "--skip-pilot", "--reason", "benchmark"],
        cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if done.returncode != 0:
        raise SystemExit(f"launch failed: {done.stderr[-2000:]}")
    return time.perf_counter() - began


def process(url: str, name: str, folder: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "campaign", "--ledger", url, "worker", name, "--artifacts",
         str(folder / name), "--no-replay-check", "--skip-pilot", "--reason", "benchmark"],
        cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    if done.returncode != 0:
        raise SystemExit(f"worker failed: {done.stderr[-2000:]}")


def cycle(ledger: Ledger, name: str) -> float:
    """Median seconds from one run's start to the next run's start of the same worker: the
    whole cost of a run, its placement included (ledger timestamps)."""
    runs = ledger.runs(name).sort_values("started_at")
    found: list[float] = []
    for _, mine in runs.groupby("worker"):
        starts = mine["started_at"].to_numpy()
        found += [(b - a) / np.timedelta64(1, "s") for a, b in itertools.pairwise(starts)]
    return statistics.median(found)


def gaps(ledger: Ledger, name: str) -> list[float]:
    """Seconds between a worker's end of one run and its claim of the next, from the ledger's
    own timestamps (start-up and CPU sharing between workers do not enter)."""
    runs = ledger.runs(name).sort_values("started_at")
    found: list[float] = []
    for _, mine in runs.groupby("worker"):
        ends, starts = mine["ended_at"].iloc[:-1].to_numpy(), mine["started_at"].iloc[1:].to_numpy()
        found += [(b - a) / np.timedelta64(1, "s") for a, b in zip(ends, starts, strict=True)]
    return found


def measure(url: str, runs: int, workers: int, rounds: int, folder: Path) -> dict[str, float]:
    """Medians of direct and worker (interleaved rounds, after a warm-up); the launch's wall
    time and the median gap between consecutive runs of a worker in each way."""
    times: dict[str, list[float]] = {"direct": [], "worker": []}
    gap: dict[str, list[float]] = {"direct": [], "worker": [], "launch": []}
    with Ledger.open(url, create=True) as ledger:
        plan(ledger, "warm-up", 2)
        direct(ledger, "warm-up", folder)
        for round_index in range(rounds):
            order = ["direct", "worker"] if round_index % 2 == 0 else ["worker", "direct"]
            for approach in order:
                name = f"{approach}-{round_index}"
                plan(ledger, name, runs)
                began = time.perf_counter()
                (direct if approach == "direct" else worker)(ledger, name, folder)
                times[approach].append(time.perf_counter() - began)
                gap[approach] += gaps(ledger, name)
        plan(ledger, "process", runs)
        process(url, "process", folder)
        cycles = {"direct": cycle(ledger, f"direct-{rounds - 1}"),
                  "process": cycle(ledger, "process")}
        plan(ledger, "launch", runs)
        wall = launch(url, "launch", workers, folder)
        gap["launch"] = gaps(ledger, "launch")
    return {
        "direct": statistics.median(times["direct"]),
        "worker": statistics.median(times["worker"]),
        "launch": wall,
        **{f"gap_{k}": statistics.median(v) for k, v in gap.items()},
        **{f"cycle_{k}": v for k, v in cycles.items()},
    }


def show(engine: str, times: dict[str, float], runs: int, workers: int) -> None:
    per_run = times["direct"] / runs
    worker_ms = (times["worker"] - times["direct"]) / runs * 1000
    launch_ms = (times["gap_launch"] - times["gap_direct"]) * 1000 + max(0.0, worker_ms)
    ideal = times["direct"] / min(workers, os.cpu_count() or 1)
    print(f"\n{engine}: {runs} runs of a trivial task, direct {per_run * 1000:.0f} ms a run")
    print(f"  direct loops in one process   {times['direct']:7.2f} s   median gap between runs "
          f"{times['gap_direct'] * 1000:6.1f} ms")
    print(f"  worker protocol, in-process   {times['worker']:7.2f} s   median gap "
          f"{times['gap_worker'] * 1000:6.1f} ms; overhead {worker_ms:6.1f} ms/run = "
          f"{worker_ms / 100:6.3f}% of a 10 s run")
    process_ms = (times["cycle_process"] - times["cycle_direct"]) * 1000
    cycle_ms = times["cycle_process"] * 1000
    print(f"  {'campaign worker process':<29} {'':>9}   run to run {cycle_ms:6.1f} ms (direct "
          f"{times['cycle_direct'] * 1000:.1f}); overhead {process_ms:6.1f} ms/run = "
          f"{process_ms / 100:6.3f}% of a 10 s run")
    label = f"launch --workers {workers}"
    print(f"  {label:<29} {times['launch']:7.2f} s   median gap "
          f"{times['gap_launch'] * 1000:6.1f} ms; overhead {launch_ms:6.1f} ms/run = "
          f"{launch_ms / 100:6.3f}% of a 10 s run")
    print(f"    + once per launch: about {times['launch'] - ideal:4.1f} s beyond the ideal "
          f"{ideal:.1f} s (launcher and worker start-up: import torch, pandas, the ledger; "
          f"CPU shared by {workers} workers)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test",
                        help="an admin URL; a scratch database is created and dropped")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="campaign-launch-bench-"))
    os.chdir(ROOT)
    sqlite = f"sqlite:///{folder / 'ledger.db'}"
    show("SQLite", measure(sqlite, args.runs, args.workers, args.rounds, folder / "sqlite"),
         args.runs, args.workers)
    name = f"campaign_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.postgres, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = args.postgres.rsplit("/", 1)[0] + f"/{name}"
        show("PostgreSQL", measure(url, args.runs, args.workers, args.rounds, folder / "pg"),
             args.runs, args.workers)
    finally:
        with psycopg.connect(args.postgres, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
