"""A team ledger shared by hundreds of workers, on a PostgreSQL left at max_connections = 100.

    python benchmarks/team_ledger.py [--workers 300] [--seconds 40] [--processes 10]
                                     [--ramp-s 0] [--through pgbouncer|direct|both]

Each simulated worker does what a real one does to the ledger, without training:
it opens two ledgers (its own, and its run's process's: two engines, as a
worker and the run it supervises hold), claims a run atomically, heartbeats
every 2 s, flushes 10 metric points every second through a metric writer, and
finishes its run. Workers are threads, spread over several processes; every
thread has its own engines, so the connections are those of separate
processes. ``direct`` connects to PostgreSQL itself, ``pgbouncer`` through
PgBouncer in transaction mode (scripts/pgbouncer, 60 server connections at
most for any number of clients).

Printed per way: refused connections, runs claimed twice, points lost or
duplicated (counted in the database against what the writers flushed),
p50/p99/max latency of a heartbeat and of a metric flush, and the most server
connections seen in use (pg_stat_activity, sampled every 0.5 s).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import common  # puts the project on sys.path; plan_runs
import psycopg

from campaign.ledger import Ledger, StopRecord

ROOT = Path(__file__).resolve().parents[1]
ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
CAMPAIGN = "team"


def simulated_worker(url: str, name: str, seconds: float, out: dict, lock: threading.Lock) -> None:
    """One worker's ledger traffic; what it saw goes into ``out`` (under ``lock``)."""
    beats, flushes, errors, claimed, points, claimed_at = [], [], [], None, 0, None
    try:
        with Ledger.open(url) as supervisor, Ledger.open(url) as child:
            claim = supervisor.claim_next(CAMPAIGN, name)
            if claim is None:
                raise RuntimeError("nothing left to claim")
            claimed, claimed_at = claim.run_id, time.time()
            writer = child.metric_writer(claim.run_id, claim.segment_id, lease=claim.lease,
                                         batch_size=10**9, interval_s=10**9)
            began = time.monotonic()
            next_beat = began + random.uniform(0, 2)
            next_flush = began + random.uniform(0, 1)
            step = 0
            while time.monotonic() - began < seconds:
                now = time.monotonic()
                if now >= next_flush:
                    for _ in range(10):
                        step += 1
                        writer.log("train/loss", step, 1.0 / step)
                    t = time.perf_counter()
                    points += writer.flush()
                    flushes.append((time.time(), time.perf_counter() - t))
                    next_flush += 1.0
                if now >= next_beat:
                    t = time.perf_counter()
                    supervisor.heartbeat(claim.run_id, lease=claim.lease)
                    beats.append((time.time(), time.perf_counter() - t))
                    next_beat += 2.0
                time.sleep(max(0.0, min(next_flush, next_beat) - time.monotonic()))
            writer.close()
            supervisor.finish(claim.run_id, "completed", StopRecord("budget_reached", step),
                              lease=claim.lease)
    except Exception as error:  # counted: a refused connection is the thing measured
        errors.append(f"{type(error).__name__}: {' '.join(str(error).split())[:400]}")
    with lock:
        out["beats"] += beats
        out["flushes"] += flushes
        out["errors"] += errors
        out["claimed"].append(claimed)
        out["claimed_at"].append(claimed_at)
        out["points"] += points


def worker_process(url: str, names: list[str], seconds: float, ramp_s: float,
                   result: str) -> None:
    out: dict = {"beats": [], "flushes": [], "errors": [], "claimed": [], "claimed_at": [],
                 "points": 0}
    lock = threading.Lock()
    threads = [threading.Thread(target=simulated_worker, args=(url, n, seconds, out, lock))
               for n in names]
    for thread in threads:  # workers arrive over ramp_s, as an array's tasks start
        thread.start()
        time.sleep(ramp_s / max(1, len(threads)))
    for thread in threads:
        thread.join()
    Path(result).write_text(json.dumps(out))


def sample_connections(database: str, stop: threading.Event, seen: list[int]) -> None:
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        while not stop.wait(0.5):
            (count,) = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                                     (database,)).fetchone()
            seen.append(int(count))


def one_way(way: str, workers: int, processes: int, seconds: float, ramp_s: float) -> dict:
    database = f"team_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    port = 6432 if way == "pgbouncer" else 5432
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/{database}"
    try:
        with Ledger.open(f"postgresql+psycopg://postgres@127.0.0.1:5432/{database}",
                         create=True) as ledger:
            common.plan_runs(ledger, CAMPAIGN, workers)
        stop, seen = threading.Event(), []
        sampler = threading.Thread(target=sample_connections, args=(database, stop, seen))
        sampler.start()
        names = [f"bench:{i}:cpu" for i in range(workers)]
        shares = [names[i::processes] for i in range(processes)]
        with tempfile.TemporaryDirectory() as folder:
            results = [str(Path(folder) / f"{i}.json") for i in range(processes)]
            context = multiprocessing.get_context("spawn")
            children = [context.Process(target=worker_process,
                                        args=(url, share, seconds, ramp_s, r))
                        for share, r in zip(shares, results, strict=True)]
            for child in children:
                child.start()
            for child in children:
                child.join()
            stop.set()
            sampler.join()
            parts = [json.loads(Path(r).read_text()) for r in results if Path(r).exists()]
        with psycopg.connect(ADMIN.rsplit("/", 1)[0] + f"/{database}") as db:
            stored, duplicated = db.execute(
                "SELECT count(*), count(*) - count(DISTINCT (segment_id, key, step)) FROM metrics"
            ).fetchone()
            twice = db.execute("SELECT count(*) FROM (SELECT run_id FROM segments GROUP BY run_id "
                               "HAVING count(*) > 1) s").fetchone()[0]
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    claimed = [c for p in parts for c in p["claimed"] if c]
    errors = [e for p in parts for e in p["errors"]]
    return {
        "way": way, "workers": workers, "errors": errors,
        "refused": sum("too many clients" in e or "no more connections" in e for e in errors),
        "claimed": len(claimed), "claimed_twice": len(claimed) - len(set(claimed)) + twice,
        "flushed": sum(p["points"] for p in parts), "stored": stored, "duplicated": duplicated,
        "beats": [b for p in parts for b in p["beats"]],
        "flushes": [f for p in parts for f in p["flushes"]],
        "steady_from": max([t for p in parts for t in p["claimed_at"] if t] or [0]) + 2,
        "connections": max(seen or [0]),
    }


def quantiles(timed: list[list[float]], since: float = 0.0) -> str:
    ordered = sorted(latency for at, latency in timed if at >= since)
    if not ordered:
        return "-"
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (f"p50 {statistics.median(ordered) * 1000:6.1f} ms  p99 {p99 * 1000:6.1f} ms  "
            f"max {ordered[-1] * 1000:7.1f} ms  (n={len(ordered)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--processes", type=int, default=10)
    parser.add_argument("--ramp-s", type=float, default=0.0,
                        help="seconds over which the workers arrive (0: all at once)")
    parser.add_argument("--through", choices=("pgbouncer", "direct", "both"), default="both")
    args = parser.parse_args()
    ways = ["pgbouncer", "direct"] if args.through == "both" else [args.through]
    if "pgbouncer" in ways:
        subprocess.run([str(ROOT / "scripts" / "pgbouncer"), "start"], check=True)
    with psycopg.connect(ADMIN) as admin:
        limit = admin.execute("SHOW max_connections").fetchone()[0]
    print(f"PostgreSQL max_connections = {limit}; {args.workers} workers x 2 engines, "
          f"{args.seconds:g} s, arriving over {args.ramp_s:g} s, heartbeat 2 s, flush of 10 "
          "points every 1 s")
    for way in ways:
        r = one_way(way, args.workers, args.processes, args.seconds, args.ramp_s)
        print(f"\n{way}: refused connections {r['refused']}, other errors "
              f"{len(r['errors']) - r['refused']}, runs claimed {r['claimed']} "
              f"(twice: {r['claimed_twice']}), points flushed {r['flushed']:,} stored "
              f"{r['stored']:,} (lost {r['flushed'] - r['stored'] + r['duplicated']:,}, "
              f"duplicated {r['duplicated']:,}), server connections in use at most "
              f"{r['connections']}")
        print(f"  heartbeat     {quantiles(r['beats'])}")
        print(f"  metric flush  {quantiles(r['flushes'])}")
        print("  once every worker had claimed (steady state):")
        print(f"  heartbeat     {quantiles(r['beats'], r['steady_from'])}")
        print(f"  metric flush  {quantiles(r['flushes'], r['steady_from'])}")
        for error in sorted(set(r["errors"]))[:3]:
            print(f"  e.g. {error}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
