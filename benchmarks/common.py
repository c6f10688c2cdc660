"""Shared helpers of the benchmarks: interleaved repetitions, medians, ledger set-up.

These machines are noisy, so absolute times are not stable: every benchmark
runs the competing approaches in the same process, interleaved round by
round, and prints ratios of medians.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from campaign.ledger import Claim, Ledger, NewRun, NewVariant


def interleaved(approaches: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Run every approach once per round, in rotating order; median seconds of each."""
    times: dict[str, list[float]] = {name: [] for name in approaches}
    names = list(approaches)
    for round_index in range(rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name in order:
            start = time.perf_counter()
            approaches[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def plan_runs(ledger: Ledger, name: str, runs: int, config_keys: int = 6) -> list[str]:
    """A campaign of ``runs`` runs (one variant) with a realistic small config."""
    config = {f"param_{i}": i * 0.1 for i in range(config_keys)}
    record = ledger.create_campaign(
        name, question="benchmark", task="bench:build", spec={"name": name},
        variants=[NewVariant("control", True, {})],
        runs=[NewRun("control", seed, {**config, "seed": seed}) for seed in range(runs)],
    )
    return list(record.run_ids)


def claim_all(ledger: Ledger, name: str, count: int) -> list[Claim]:
    claims = []
    for _ in range(count):
        claim = ledger.claim_next(name, "bench")
        assert claim is not None
        claims.append(claim)
    return claims


def report(title: str, medians: dict[str, float], baseline: str, work: int, unit: str) -> None:
    """Print rate and ratio to ``baseline`` for each approach."""
    print(f"\n{title}")
    base = medians[baseline]
    for name, seconds in medians.items():
        rate = work / seconds if seconds else float("inf")
        print(f"  {name:<48} {seconds * 1000:9.1f} ms  {rate:12,.0f} {unit}/s  "
              f"{base / seconds:5.2f}x of {baseline}")
