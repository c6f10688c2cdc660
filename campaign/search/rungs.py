"""A rung's decision, from the values each variant's seeds reached there (pure: no ledger).

``rank``: classic successive halving, the best ``keep`` share continues (at least one).
``evidence``: of those the rank rule would prune, only a variant whose paired-seed interval
against the rung's best variant excludes zero in the bad direction is pruned; the others
continue. A variant with a seed without a value at the rung (diverged, failed) is pruned and
never audited (it cannot reach the end). Each pruned variant with values is audited with
probability ``audit`` (a seeded draw): it continues to the full budget as audit runs, its
outcome ``audit``, left out of every conclusion. The same chance at every rung makes the
audited an equal-probability sample of the pruned, so their wrong-prune rate estimates the
whole's without weighting (a share rounded up per rung would over-sample the late rungs,
whose prunes are more often wrong).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from campaign.stats import paired_interval


@dataclass(frozen=True)
class RungDecision:
    variant: str
    outcome: str  # kept | pruned | audit
    rank: int | None  # 1 = best at the rung; None without a value for every seed
    mean: float | None
    against: str | None  # the best variant the evidence rule compared with
    deltas: dict[str, float]  # per seed: this variant minus the best (evidence rule)
    interval: tuple[float, float] | None
    reason: str


def kept_count(alive: int, keep: float) -> int:
    """How many continue of ``alive``: floor(keep x alive), at least one."""
    return max(1, math.floor(keep * alive + 1e-9))


def decide(values: Mapping[str, Mapping[int, float | None]], seeds: Sequence[int], *,
           keep: float, rule: str, mode: str, audit: float, audit_seed: int) -> list[RungDecision]:
    """One decision per variant in ``values`` (variant -> seed -> value at the rung)."""
    sign = 1.0 if mode == "max" else -1.0
    complete = {v: [float(s[seed]) for seed in seeds]  # type: ignore[arg-type]
                for v, s in values.items()
                if all(s.get(seed) is not None and math.isfinite(s[seed]) for seed in seeds)}
    ranked = sorted(complete, key=lambda v: (-sign * sum(complete[v]) / len(seeds), v))
    count = kept_count(len(values), keep)
    best = ranked[0] if ranked else None
    decisions: dict[str, RungDecision] = {}
    for position, variant in enumerate(ranked):
        mean = sum(complete[variant]) / len(seeds)
        deltas: dict[str, float] = {}
        interval = None
        if best is not None and variant != best:
            deltas = {str(seed): complete[variant][i] - complete[best][i]
                      for i, seed in enumerate(seeds)}
            interval = paired_interval(list(deltas.values()))
        if position < count:
            outcome, reason = "kept", f"rank {position + 1} of {len(values)}, {count} kept"
        elif rule == "rank":
            outcome, reason = "pruned", f"rank {position + 1} of {len(values)}, {count} kept"
        elif interval is not None and sign * interval[1 if sign > 0 else 0] < 0:
            outcome = "pruned"
            reason = (f"rank {position + 1} of {len(values)}; its paired 95% interval against "
                      f"{best} [{interval[0]:+.4g}, {interval[1]:+.4g}] excludes zero")
        else:
            outcome = "kept"
            reason = (f"rank {position + 1} of {len(values)}, but no evidence it is worse than "
                      f"{best}: " + ("too few seeds for an interval" if interval is None else
                                     f"its paired 95% interval [{interval[0]:+.4g}, "
                                     f"{interval[1]:+.4g}] includes zero"))
        decisions[variant] = RungDecision(variant, outcome, position + 1, mean, best, deltas,
                                          interval, reason)
    for variant, seeds_values in values.items():
        if variant not in decisions:
            missing = [str(s) for s in seeds if seeds_values.get(s) is None]
            decisions[variant] = RungDecision(
                variant, "pruned", None, None, best, {}, None,
                f"no value at the rung for seed{'s' * (len(missing) > 1)} {', '.join(missing)}")
    prunable = sorted(v for v, d in decisions.items() if d.outcome == "pruned" and d.rank)
    draws = random.Random(audit_seed)
    for variant in prunable:
        if draws.random() < audit:
            d = decisions[variant]
            decisions[variant] = RungDecision(
                d.variant, "audit", d.rank, d.mean, d.against, d.deltas, d.interval,
                d.reason + "; audited: continues to the full budget, out of every conclusion")
    return [decisions[v] for v in values]
