"""Run lifecycle: create + claim + complete a run (with its events), against Optuna trials.

    python benchmarks/lifecycle.py [--runs 500] [--rounds 3]

Target: at least 4x the rate at which Optuna's SQLite storage creates and
completes trials (about 92 trials/s measured on this kind of machine), i.e.
at least 370 runs/s. Each ledger run is three transactions (plan, claim,
finish) writing five rows of events, a segment and the run itself.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import interleaved, report

from campaign.ledger import Ledger, StopRecord


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="campaign-lifecycle-"))
    ledger = Ledger.open(f"sqlite:///{folder / 'ledger.db'}", create=True)
    from common import plan_runs

    counter = iter(range(10_000))

    def campaign_runs() -> None:
        name = f"life-{next(counter)}"
        plan_runs(ledger, name, 1)  # the campaign and its control variant
        for seed in range(args.runs):
            ledger.add_run(name, "control", seed + 1, {"seed": seed, "lr": 1e-4})
            claim = ledger.claim_next(name, "bench")
            ledger.finish(claim.run_id, "completed", StopRecord("budget_reached", 200, "update"))
        # the first planned run is left planned; it is not counted

    approaches = {"campaign Ledger: add_run + claim_next + finish": campaign_runs}
    try:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = optuna.storages.RDBStorage(f"sqlite:///{folder / 'optuna.db'}")

        def optuna_trials() -> None:
            study = optuna.create_study(storage=storage, study_name=f"s-{next(counter)}")
            for _ in range(args.runs):
                trial = study.ask()
                study.tell(trial, 0.5)

        approaches["Optuna RDBStorage (SQLite): ask + tell"] = optuna_trials
    except ImportError:
        print("Optuna not installed: only the ledger is measured (anchor: ~92 trials/s)")
    start = time.perf_counter()
    medians = interleaved(approaches, args.rounds)
    report(f"Run lifecycle, {args.runs} runs per round (SQLite, WAL)", medians,
           next(iter(approaches)), args.runs, "runs")
    rate = args.runs / medians[next(iter(approaches))]
    print(
        f"  ledger: {rate:,.0f} runs/s (target >= 370); total {time.perf_counter() - start:.1f} s"
    )
    ledger.close()


if __name__ == "__main__":
    main()
