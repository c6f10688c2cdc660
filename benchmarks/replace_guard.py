"""What revision 0006's REPLACE guard on ``metrics`` costs SQLite ingest, and 0007's kept-value
check PostgreSQL ingest.

    python benchmarks/replace_guard.py [--points 200000] [--rounds 5]
    python benchmarks/replace_guard.py --postgresql postgresql://postgres@127.0.0.1:5432/test

Two SQLite ledgers at head: one as migrated (``metrics_guard``: the open-segment check of
0005 and a primary-key lookup per inserted point, so that ``INSERT OR REPLACE`` cannot
rewrite a stored point, in one trigger), one where this benchmark put back 0005's
``metrics_open`` alone; the Ledger writer ingests the same points into each (batches of
1,000, the default), interleaved round by round, medians. (The guard first came as a
second trigger: 0.75x the rate of none, most of it the second trigger program's start.)

With ``--postgresql ADMIN_URL``: two databases created (and dropped) on that server, one at
head (0007: the segment-open trigger function also looks the point's key up), one with the
function's 0005 body put back; the writer (COPY) ingests into each the same way.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import claim_all, interleaved, plan_runs
from ingest import log_points

from campaign.ledger import Ledger

VERSIONS = Path(__file__).resolve().parents[1] / "campaign" / "migrations" / "versions"
sys.path.insert(0, str(VERSIONS))
METRICS_OPEN_0005 = __import__("0006_every_statement").METRICS_OPEN_0005
KEPT_0007 = __import__("0007_metric_values_kept")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--postgresql", metavar="ADMIN_URL", default=None)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="campaign-guard-"))
    ledgers, claims, dropped = {}, {}, []
    for name in ("with the guard", "guard dropped"):
        if args.postgresql:
            url = _postgresql_database(args.postgresql, name.split()[0], dropped)
            ledger = Ledger.open(url, create=True)
            if name == "guard dropped":
                import psycopg

                with psycopg.connect(url, autocommit=True) as conn:  # no placeholders parsed
                    conn.execute(KEPT_0007._function(KEPT_0007._OPEN))
        else:
            path = folder / f"{name.split()[0]}.db"
            ledger = Ledger.open(f"sqlite:///{path}", create=True)
            if name == "guard dropped":
                with sqlite3.connect(path) as raw:
                    raw.execute("DROP TRIGGER metrics_guard")
                    raw.execute(METRICS_OPEN_0005)
        plan_runs(ledger, "guard", args.rounds + 1)
        ledgers[name], claims[name] = ledger, iter(claim_all(ledger, "guard", args.rounds + 1))
    try:
        _measure(args, ledgers, claims)
    finally:
        for ledger in ledgers.values():
            ledger.close()
        for drop in dropped:
            drop()


def _postgresql_database(admin: str, name: str, dropped: list) -> str:
    import psycopg

    database = f"campaign_guard_{name}_{os.getpid()}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')

    def drop() -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')

    dropped.append(drop)
    return admin.rsplit("/", 1)[0] + f"/{database}"


def _measure(args: argparse.Namespace, ledgers: dict, claims: dict) -> None:
    engine = "PostgreSQL" if args.postgresql else "SQLite"
    print(f"{engine}, {args.points:,} points a round, {args.rounds} interleaved rounds")

    def ingest(name: str):
        def run() -> None:
            claim = next(claims[name])
            with ledgers[name].metric_writer(claim.run_id, claim.segment_id, batch_size=1000,
                                             interval_s=3600) as writer:
                log_points(writer, args.points)

        return run

    medians = interleaved({name: ingest(name) for name in ledgers}, args.rounds)
    for name, seconds in medians.items():
        print(f"  {name:<16} {args.points / seconds:12,.0f} points/s")
    extra = (medians["with the guard"] - medians["guard dropped"]) / args.points
    print(f"  the guard costs {extra * 1e6:.2f} us a point "
          f"({medians['guard dropped'] / medians['with the guard']:.2f}x the rate without it)")


if __name__ == "__main__":
    main()
