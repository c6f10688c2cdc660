"""Metric ingest: the Ledger's writer against raw driver inserts (and others, if installed).

    python benchmarks/ingest.py [--points 200000] [--rounds 5] [--postgres URL]

SQLite: raw ``sqlite3.executemany`` in one transaction is the baseline; the
writer must reach >= 0.9x of it, and >= 0.85x with a commit per 1,000-point
batch. SQLAlchemy Core with dicts is shown for context, and MLflow's
``log_batch`` when mlflow is importable. The caller-side cost of one
``log`` call is measured without flushing. PostgreSQL (``--postgres``): the
writer against raw psycopg ``executemany`` and ``COPY``.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

from common import claim_all, interleaved, plan_runs, report
from sqlalchemy import insert

from campaign.ledger import Ledger
from campaign.ledger.models import Metric

RAW_SQL = (
    "INSERT INTO metrics (run_id, segment_id, key, step, value, examples_seen, wall_time) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
KEYS = ("train/loss", "train/lr", "train/grad_norm", "val/loss")


def points(run_id: str, segment_id: int, count: int) -> list[tuple]:
    now = time.time()
    return [
        (run_id, segment_id, KEYS[i % 4], i // 4, 1.0 / (i + 1), 16 * (i // 4), now + i * 1e-6)
        for i in range(count)
    ]


def log_points(writer, count: int) -> None:
    """The caller forms each point once and logs it: what ``points`` does for raw."""
    now = time.time()
    log = writer.log
    for i in range(count):
        log(KEYS[i % 4], i // 4, 1.0 / (i + 1), 16 * (i // 4), now + i * 1e-6)


def sqlite_bench(count: int, rounds: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="campaign-ingest-"))
    url = f"sqlite:///{folder / 'ingest.db'}"
    ledger = Ledger.open(url, create=True)
    approaches = 7
    plan_runs(ledger, "ingest", rounds * approaches + 1)
    claims = iter(claim_all(ledger, "ingest", rounds * approaches + 1))
    raw = sqlite3.connect(folder / "ingest.db", isolation_level=None)

    def raw_one_transaction() -> None:
        claim = next(claims)
        rows = points(claim.run_id, claim.segment_id, count)
        raw.execute("BEGIN")
        raw.executemany(RAW_SQL, rows)
        raw.execute("COMMIT")

    def raw_commit_per_1000() -> None:
        claim = next(claims)
        rows = points(claim.run_id, claim.segment_id, count)
        for start in range(0, count, 1000):
            raw.execute("BEGIN")
            raw.executemany(RAW_SQL, rows[start : start + 1000])
            raw.execute("COMMIT")

    def writer(batch_size: int):
        def run() -> None:
            claim = next(claims)
            with ledger.metric_writer(claim.run_id, claim.segment_id, batch_size=batch_size,
                                      interval_s=3600) as w:
                log_points(w, count)

        return run

    def writer_flush_only() -> None:
        claim = next(claims)
        w = ledger.metric_writer(claim.run_id, claim.segment_id, batch_size=count + 1,
                                 interval_s=3600)
        w._buffer = points(claim.run_id, claim.segment_id, count)  # the same prebuilt tuples
        w.close()

    def sqlalchemy_core_dicts() -> None:
        claim = next(claims)
        names = ("run_id", "segment_id", "key", "step", "value", "examples_seen", "wall_time")
        rows = [dict(zip(names, row, strict=True))
                for row in points(claim.run_id, claim.segment_id, count)]
        with ledger.engine.begin() as conn:
            conn.execute(insert(Metric.__table__), rows)

    medians = interleaved(
        {
            "raw sqlite3 executemany, one transaction": raw_one_transaction,
            "Ledger writer, one transaction": writer(count),
            "Ledger writer flush of a prebuilt buffer": writer_flush_only,
            "raw sqlite3, commit per 1,000": raw_commit_per_1000,
            "Ledger writer, batch 1,000 (WAL)": writer(1000),
            "SQLAlchemy Core insert of dicts": sqlalchemy_core_dicts,
        },
        rounds,
    )
    report(f"SQLite ingest, {count:,} points (includes building the points)", medians,
           "raw sqlite3 executemany, one transaction", count, "points")
    base_1000 = medians["raw sqlite3, commit per 1,000"]
    print(f"  writer batch 1,000 vs raw commit per 1,000: "
          f"{base_1000 / medians['Ledger writer, batch 1,000 (WAL)']:.2f}x")
    caller_side(ledger, next(claims), count)
    mlflow_rate = mlflow_bench(folder, count)
    if mlflow_rate:
        ours = count / medians["Ledger writer, batch 1,000 (WAL)"]
        print(f"  Ledger writer (batch 1,000) vs MLflow log_batch: {ours / mlflow_rate:.0f}x")
    ledger.close()


def caller_side(ledger: Ledger, claim, count: int) -> None:
    writer = ledger.metric_writer(claim.run_id, claim.segment_id, batch_size=count + 1,
                                  interval_s=3600)
    start = time.perf_counter()
    for i in range(count):
        writer.log("train/loss", i, 0.5, 16 * i)
    per_point = (time.perf_counter() - start) / count
    writer.close()
    print(f"\nCaller-side cost of MetricWriter.log (buffering, no flush): "
          f"{per_point * 1e6:.2f} us/point")


def mlflow_bench(folder: Path, count: int) -> float | None:
    try:
        import mlflow
        from mlflow.entities import Metric as MlflowMetric
    except ImportError:
        print("\nMLflow not installed: skipped (pip install mlflow-skinny to compare)")
        return None
    import logging

    logging.getLogger("alembic").setLevel(logging.WARNING)
    mlflow.set_tracking_uri(f"sqlite:///{folder / 'mlflow.db'}")
    client = mlflow.MlflowClient()
    experiment = client.create_experiment("ingest")
    run = client.create_run(experiment)
    n = min(count, 20_000)
    now = int(time.time() * 1000)
    batch = [MlflowMetric(KEYS[i % 4], 1.0 / (i + 1), now, i // 4) for i in range(n)]
    start = time.perf_counter()
    for offset in range(0, n, 1000):
        client.log_batch(run.info.run_id, metrics=batch[offset : offset + 1000])
    batch_rate = n / (time.perf_counter() - start)
    m = 300
    start = time.perf_counter()
    for i in range(m):
        client.log_metric(run.info.run_id, "single", 0.5, step=i)
    per_point = (time.perf_counter() - start) / m
    print(f"\nMLflow {mlflow.__version__} SQLite store: log_batch {batch_rate:,.0f} points/s "
          f"({n:,} points), log_metric {per_point * 1000:.2f} ms/point")
    return batch_rate


def postgres_bench(url: str, count: int, rounds: int) -> None:
    import psycopg
    from sqlalchemy.engine import make_url

    ledger = Ledger.open(url, create=True)
    plan_runs(ledger, f"ingest-{time.time_ns()}", rounds * 3)
    name = ledger.campaigns()["name"].iloc[-1]
    claims = iter(claim_all(ledger, name, rounds * 3))
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    raw = psycopg.connect(dsn)
    sql = RAW_SQL.replace("?", "%s")

    def raw_executemany() -> None:
        claim = next(claims)
        with raw.cursor() as cursor:
            cursor.executemany(sql, points(claim.run_id, claim.segment_id, count))
        raw.commit()

    def raw_copy() -> None:
        claim = next(claims)
        with (
            raw.cursor() as cursor,
            cursor.copy(
                "COPY metrics (run_id, segment_id, key, step, value, examples_seen, wall_time) "
                "FROM STDIN"
            ) as copy,
        ):
            for row in points(claim.run_id, claim.segment_id, count):
                copy.write_row(row)
        raw.commit()

    def writer() -> None:
        claim = next(claims)
        with ledger.metric_writer(claim.run_id, claim.segment_id, batch_size=count,
                                  interval_s=3600) as w:
            log_points(w, count)

    medians = interleaved(
        {"raw psycopg executemany": raw_executemany, "raw psycopg COPY": raw_copy,
         "Ledger writer, one transaction": writer},
        rounds,
    )
    report(f"PostgreSQL ingest, {count:,} points", medians, "raw psycopg executemany", count,
           "points")
    raw.close()
    ledger.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--postgres", help="also run against this PostgreSQL ledger URL")
    args = parser.parse_args()
    sqlite_bench(args.points, args.rounds)
    if args.postgres:
        postgres_bench(args.postgres, args.points, max(3, args.rounds // 2))


if __name__ == "__main__":
    main()
