"""The report against a plain pandas read-and-aggregate of the same rows.

    python benchmarks/report.py [--runs 1000] [--points 1000] [--rounds 3]

A synthetic SQLite ledger of 1,000 runs x 1,000 metric points (train/loss at
every update, val/accuracy every 10th: 1,100 points a run, 1.1 M rows) in 4
variants. Compared, interleaved, medians:

- raw: ``pandas.read_sql`` of the runs and metrics tables on the driver
  connection, then one groupby per run (last and best validation value,
  updates done, examples seen) and per variant (count, mean, std, min, max);
- balance sheet: ``balance_sheet()`` (every frame of the report);
- whole HTML report: the balance sheet, the figures and the self-contained
  HTML (what ``campaign report`` does).

Goal: the whole report in at most 3x the raw read-and-aggregate time.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

import pandas as pd
from common import interleaved

from campaign.ledger import Ledger, NewRun, NewVariant, StopRecord
from campaign.report.balance import balance_sheet
from campaign.report.render import html

VARIANTS = {"lr-1e-4": 1e-4, "lr-5e-5": 5e-5, "lr-2e-4": 2e-4, "lr-1e-3": 1e-3}


def build(path: Path, runs: int, points: int, running: int = 0) -> None:
    """The synthetic ledger; the last ``running`` runs are left running (a live campaign)."""
    with Ledger.open(f"sqlite:///{path}", create=True) as ledger:
        per = runs // len(VARIANTS)
        ledger.create_campaign(
            "big", question="report benchmark", task="bench:build",
            spec={"validation": {"metric": "val/accuracy", "mode": "max"}},
            variants=[NewVariant(v, i == 0, {"optimizer.lr": lr})
                      for i, (v, lr) in enumerate(VARIANTS.items())],
            runs=[NewRun(v, seed, {"budget": {"updates": points}, "seed": seed,
                                   "optimizer": {"lr": lr}})
                  for v, lr in VARIANTS.items() for seed in range(per)],
        )
        for index in range(runs):
            claim = ledger.claim_next("big", "bench")
            assert claim is not None
            with ledger.metric_writer(claim.run_id, claim.segment_id, batch_size=5000) as w:
                for step in range(1, points + 1):
                    w.log("train/loss", step, 2.0 / step + index * 1e-6, step * 16, 0.0)
                    if step % 10 == 0:
                        w.log("val/accuracy", step, 1 - 1.0 / step, step * 16, 0.0)
            if index >= runs - running:
                continue
            status, cause = ("diverged", "non_finite_loss") if index % 97 == 0 else (
                "completed", "budget_reached")
            ledger.finish(claim.run_id, status, StopRecord(cause, points, "update"))


def raw(path: Path) -> pd.DataFrame:
    with sqlite3.connect(path) as conn:
        runs = pd.read_sql("SELECT r.id AS run_id, v.name AS variant, r.seed, r.status, "
                           "r.stop_cause FROM runs r JOIN variants v ON v.id = r.variant_id",
                           conn)
        metrics = pd.read_sql("SELECT run_id, key, step, value, examples_seen FROM metrics",
                              conn)
    loss = metrics[metrics["key"] == "train/loss"].groupby("run_id")
    val = metrics[metrics["key"] == "val/accuracy"].sort_values("step").groupby("run_id")
    table = runs.set_index("run_id").join(pd.DataFrame({
        "updates_done": loss["step"].max(), "examples_seen": loss["examples_seen"].max(),
        "final": val["value"].last(), "best": val["value"].max(),
    }))
    return table.groupby("variant")["final"].agg(["count", "mean", "std", "min", "max"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--points", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    path = Path(tempfile.mkdtemp(prefix="campaign-report-")) / "ledger.db"
    began = time.perf_counter()
    build(path, args.runs, args.points)
    print(f"built {args.runs} runs x {args.points} updates in {time.perf_counter() - began:.0f} s")
    ledger = Ledger.open(f"sqlite:///{path}", create=True)
    medians = interleaved(
        {
            "raw read_sql + pandas groupby": lambda: raw(path),
            "balance sheet (every frame)": lambda: balance_sheet(ledger, "big"),
            "whole HTML report (sheet + figures)": lambda: html(balance_sheet(ledger, "big")),
        },
        args.rounds,
    )
    base = medians["raw read_sql + pandas groupby"]
    for name, seconds in medians.items():
        print(f"  {name:<40} {seconds:7.2f} s   {seconds / base:5.2f}x of raw")


if __name__ == "__main__":
    main()
