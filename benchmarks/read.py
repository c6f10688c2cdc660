"""Reads into pandas: Ledger.metrics against pandas.read_sql, and the comparison table.

    python benchmarks/read.py [--points 200000] [--runs 500] [--rounds 5]

One run's 200k points: ``Ledger.metrics`` must take at most 1.3x
``pandas.read_sql`` on the raw driver connection (read_sql on a SQLAlchemy
Connection is shown for context). A 500-run comparison table (flattened
config + latest value of each metric) must take at most 0.03 s.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

import pandas as pd
from common import claim_all, interleaved, plan_runs, report
from sqlalchemy import text

from campaign.ledger import Ledger

SQL = (
    "SELECT run_id, segment_id, key, step, value, examples_seen, wall_time FROM metrics "
    "WHERE run_id = ? ORDER BY run_id, key, step, segment_id"
)


def one_run(ledger: Ledger, db: Path, count: int, rounds: int) -> None:
    plan_runs(ledger, "big", 1)
    claim = claim_all(ledger, "big", 1)[0]
    with ledger.metric_writer(claim.run_id, claim.segment_id, batch_size=10_000) as writer:
        for i in range(count):
            writer.log(("train/loss", "train/lr", "train/grad_norm", "val/loss")[i % 4], i // 4,
                       1.0 / (i + 1), 16 * (i // 4))
    raw = sqlite3.connect(db)

    def ledger_metrics() -> None:
        assert len(ledger.metrics(runs=[claim.run_id])) == count

    def read_sql_driver() -> None:
        assert len(pd.read_sql(SQL, raw, params=(claim.run_id,))) == count

    def read_sql_sqlalchemy() -> None:
        with ledger.engine.connect() as conn:
            frame = pd.read_sql(text(SQL.replace("?", ":run")), conn,
                                params={"run": claim.run_id})
        assert len(frame) == count

    medians = interleaved(
        {"pandas.read_sql on the driver connection": read_sql_driver,
         "Ledger.metrics": ledger_metrics,
         "pandas.read_sql on a SQLAlchemy Connection": read_sql_sqlalchemy},
        rounds,
    )
    report(f"One run's {count:,} points into a DataFrame (SQLite)", medians,
           "pandas.read_sql on the driver connection", count, "points")
    base = medians["pandas.read_sql on the driver connection"]
    print(f"  Ledger.metrics / read_sql(driver) = {medians['Ledger.metrics'] / base:.2f} "
          "(target <= 1.3)")


def comparison(ledger: Ledger, runs: int, rounds: int) -> None:
    plan_runs(ledger, "wide", runs)
    for claim in claim_all(ledger, "wide", runs):
        with ledger.metric_writer(claim.run_id, claim.segment_id, batch_size=10_000) as writer:
            for step in range(200):
                writer.log("train/loss", step, 1.0 / (step + 1))
            for step in range(0, 200, 25):
                writer.log_dict(step, {"val/loss": 0.5, "val/accuracy": step / 200})
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        table = ledger.comparison("wide", keys=["train/loss", "val/loss", "val/accuracy"])
        times.append(time.perf_counter() - start)
    assert len(table) == runs
    discover = []
    for _ in range(rounds):
        start = time.perf_counter()
        ledger.comparison("wide")
        discover.append(time.perf_counter() - start)
    print(f"\n{runs}-run comparison table (config + latest of 3 metrics, "
          f"{runs * 216:,} points in the campaign):")
    print(f"  keys given:      median {sorted(times)[len(times) // 2] * 1000:6.1f} ms "
          "(target <= 30 ms)")
    print(f"  keys discovered: median {sorted(discover)[len(discover) // 2] * 1000:6.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    db = Path(tempfile.mkdtemp(prefix="campaign-read-")) / "read.db"
    with Ledger.open(f"sqlite:///{db}", create=True) as ledger:
        one_run(ledger, db, args.points, args.rounds)
        comparison(ledger, args.runs, args.rounds)


if __name__ == "__main__":
    main()
