"""A search's pruning and conclusion measured against the anchors, on the same landscapes.

Part 1, simulation (no training; ``--searches`` repeated searches on fresh landscapes): 27
variants and a control, each with a learning curve ``mu - a * (exp(-t / tau) - exp(-81 /
tau))`` (``mu`` at the budget; late bloomers cross early leaders), a per-seed offset and
per-evaluation noise; budget 81 updates, rungs
9 and 27 (keep 1/3, reduction factor 3), 3 seeds per variant (every method reports the mean
of the 3 seeds, so compute is comparable). Methods, each with its own scheduler:

- campaign halving, rule ``rank`` and rule ``evidence`` (``campaign.search.rungs.decide``,
  the product's own decision), audit 0.1 (``--audit``), the 2 best confirmed on 3 fresh
  seeds, Holm;
- Optuna: ``TPESampler`` with the 27 variants enqueued (every method sees the same
  variants) and ``SuccessiveHalvingPruner(min_resource=9, reduction_factor=3)``, trials one
  after the other as ``study.optimize`` runs them;
- Ray Tune: ``ASHAScheduler(grace_period=9, reduction_factor=3, max_t=81)`` driven through its
  own ``on_trial_add`` / ``on_trial_result`` / ``on_trial_complete``, 4 trials at a time.

Measured: P(the search names the true best variant), updates spent, the true wrong-prune rate
(a pruned variant whose full-budget mean would beat the worst survivor's), the audit's
estimate of it (pooled, and how often one search's own audit interval holds that search's
true rate), and on null landscapes (no variant better than the control) the rate of a
false "better than the control" conclusion: the product's from its confirmation (Holm), the
anchors' from their best trial against the control on the search's own seeds (paired t, 5%).

Part 2 (``--real``): the digits task (learning rate x width x weight decay, 18 variants),
the whole grid against a halving search over it on one SQLite ledger: updates spent, whether
the search's best is within 1% of the grid's best, and the audit's wrong-prune estimate
against the completed grid's truth.

Usage: python benchmarks/search.py --searches 2000 [--real]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from campaign.search.rungs import decide  # noqa: E402
from campaign.stats import holm, paired_p  # noqa: E402

VARIANTS, SEEDS, BUDGET, RUNGS, KEEP, ETA = 27, 3, 81, (9, 27), 1 / 3, 3
CONFIRM = 2
AUDIT = [0.1]  # --audit


@dataclass
class Landscape:
    """True curves of the variants (index VARIANTS is the control) and their seed noise."""

    mu: np.ndarray
    a: np.ndarray
    tau: np.ndarray
    offset: np.ndarray  # (variants + 1, seeds): search seeds, then confirmation seeds
    rng: np.random.Generator

    @classmethod
    def draw(cls, rng: np.random.Generator, null: bool) -> Landscape:
        mu = np.full(VARIANTS + 1, 0.80)
        if not null:
            mu[:VARIANTS] += 0.04 * rng.standard_normal(VARIANTS)
        a = rng.uniform(0.2, 0.5, VARIANTS + 1)
        tau = np.exp(rng.uniform(math.log(4), math.log(60), VARIANTS + 1))
        offset = 0.02 * rng.standard_normal((VARIANTS + 1, 2 * SEEDS))
        return cls(mu, a, tau, offset, rng)

    def value(self, variant: int, seed: int, step: int) -> float:
        """``mu`` is the value at the budget: on a null landscape every variant ends equal,
        however differently it got there."""
        tau = self.tau[variant]
        curve = self.mu[variant] - self.a[variant] * (math.exp(-step / tau)
                                                      - math.exp(-BUDGET / tau))
        return float(curve + self.offset[variant, seed] + 0.01 * self.rng.standard_normal())

    def values(self, variant: int, step: int, seeds: range = range(SEEDS)) -> list[float]:
        return [self.value(variant, s, step) for s in seeds]


@dataclass
class Outcome:
    best: int | None  # the variant the search names best
    updates: int  # updates spent by the search (every seed), the control's included
    confirm_updates: int = 0
    audit_updates: int = 0  # of ``updates``: the audited variants' continuation
    pruned_wrong: list[bool] = field(default_factory=list)  # truth over every pruned variant
    audited_wrong: list[bool] = field(default_factory=list)  # what the audit measured
    better: bool = False  # concluded some variant beats the control


def _finals(land: Landscape, variants: list[int]) -> dict[int, float]:
    return {v: float(np.mean(land.values(v, BUDGET))) for v in variants}


def _wrong(land: Landscape, pruned: list[int], survivors: dict[int, float]) -> list[bool]:
    """For each pruned variant: would its full-budget mean beat the worst survivor's?"""
    if not survivors:
        return []
    worst = min(survivors.values())
    return [f > worst for f in _finals(land, pruned).values()]


def campaign_halving(land: Landscape, rule: str, seed: int) -> Outcome:
    alive, updates, pruned, audited, audit_spent = list(range(VARIANTS)), 0, [], [], 0
    done = 0
    for index, rung in enumerate(RUNGS):
        updates += len(alive) * SEEDS * (rung - done)
        values = {str(v): dict(enumerate(land.values(v, rung))) for v in alive}
        decided = decide(values, tuple(range(SEEDS)), keep=KEEP, rule=rule, mode="max",
                         audit=AUDIT[0], audit_seed=seed * 10 + index)
        alive = [int(d.variant) for d in decided if d.outcome == "kept"]
        pruned += [int(d.variant) for d in decided if d.outcome != "kept"]
        audit_now = [int(d.variant) for d in decided if d.outcome == "audit"]
        audited += audit_now
        audit_spent += len(audit_now) * SEEDS * (BUDGET - rung)
        done = rung
    updates += len(alive) * SEEDS * (BUDGET - done) + SEEDS * BUDGET  # survivors, control
    finals = _finals(land, alive)
    control = land.values(VARIANTS, BUDGET)
    ranked = sorted(finals, key=lambda v: -finals[v])
    outcome = Outcome(ranked[0] if ranked else None, updates + audit_spent,
                      audit_updates=audit_spent)
    outcome.pruned_wrong = _wrong(land, pruned, finals)
    outcome.audited_wrong = _wrong(land, audited, finals)
    chosen = ranked[:CONFIRM]
    fresh = range(SEEDS, 2 * SEEDS)
    base = land.values(VARIANTS, BUDGET, fresh)
    outcome.confirm_updates = (len(chosen) + 1) * SEEDS * BUDGET
    tests, means = {}, {}
    for v in chosen:
        deltas = [x - b for x, b in zip(land.values(v, BUDGET, fresh), base, strict=True)]
        tests[v], means[v] = paired_p(deltas), float(np.mean(deltas))
    adjusted = holm({v: p for v, p in tests.items() if p is not None})
    outcome.better = any(q < 0.05 and means[v] > 0 for v, q in adjusted.items())
    del control
    return outcome


def _naive_better(land: Landscape, best: int | None, best_values: list[float]) -> bool:
    """The anchors' report: the best trial against the control on the search's own seeds."""
    if best is None:
        return False
    control = land.values(VARIANTS, BUDGET)
    deltas = [x - c for x, c in zip(best_values, control, strict=True)]
    p = paired_p(deltas)
    return p is not None and p < 0.05 and float(np.mean(deltas)) > 0


def optuna_halving(land: Landscape, seed: int) -> Outcome:
    import optuna

    study = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed),
        pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=RUNGS[0],
                                                      reduction_factor=ETA))
    for v in range(VARIANTS):
        study.enqueue_trial({"variant": v})
    spent = {"updates": SEEDS * BUDGET}
    seen: dict[int, list[float]] = {}

    def objective(trial: optuna.Trial) -> float:
        v = trial.suggest_int("variant", 0, VARIANTS - 1)
        done = 0
        for step in (*RUNGS, BUDGET):
            spent["updates"] += SEEDS * (step - done)
            done = step
            values = land.values(v, step)
            if step == BUDGET:
                seen[trial.number] = values
                return float(np.mean(values))
            trial.report(float(np.mean(values)), step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        raise AssertionError("unreachable")

    study.optimize(objective, n_trials=VARIANTS)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    pruned = [t.params["variant"] for t in study.trials
              if t.state == optuna.trial.TrialState.PRUNED]
    best = max(complete, key=lambda t: t.value) if complete else None
    finals = {t.params["variant"]: float(t.value) for t in complete}
    outcome = Outcome(None if best is None else best.params["variant"], spent["updates"])
    outcome.pruned_wrong = _wrong(land, pruned, finals)
    outcome.better = _naive_better(land, outcome.best,
                                   seen[best.number] if best is not None else [])
    return outcome


class _Trial:
    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id


def ray_asha(land: Landscape, seed: int, parallel: int = 4) -> Outcome:
    from ray.tune.schedulers import ASHAScheduler, TrialScheduler

    np.random.seed(seed)  # ASHA draws its bracket with numpy's global generator
    scheduler = ASHAScheduler(time_attr="training_iteration", metric="score", mode="max",
                              max_t=BUDGET, grace_period=RUNGS[0], reduction_factor=ETA)
    waiting = list(range(VARIANTS))
    running: dict[int, int] = {}  # variant -> next milestone index
    milestones = (*RUNGS, BUDGET)
    updates, finals, pruned, seen = SEEDS * BUDGET, {}, [], {}
    trials = {v: _Trial(f"t{v}") for v in waiting}
    while waiting or running:
        while waiting and len(running) < parallel:
            v = waiting.pop(0)
            scheduler.on_trial_add(None, trials[v])
            running[v] = 0
        v = min(running, key=lambda k: (milestones[running[k]], k))  # the next to report
        index = running[v]
        step = milestones[index]
        updates += SEEDS * (step - (milestones[index - 1] if index else 0))
        values = land.values(v, step)
        result = {"training_iteration": step, "score": float(np.mean(values))}
        if step == BUDGET:
            scheduler.on_trial_complete(None, trials[v], result)
            finals[v], seen[v] = result["score"], values
            del running[v]
        elif scheduler.on_trial_result(None, trials[v], result) == TrialScheduler.STOP:
            pruned.append(v)
            scheduler.on_trial_remove(None, trials[v])
            del running[v]
        else:
            running[v] = index + 1
    best = max(finals, key=lambda k: finals[k]) if finals else None
    outcome = Outcome(best, updates)
    outcome.pruned_wrong = _wrong(land, pruned, finals)
    outcome.better = _naive_better(land, best, seen.get(best, []) if best is not None else [])
    return outcome


METHODS = {
    "campaign halving (rank)": lambda land, s: campaign_halving(land, "rank", s),
    "campaign halving (evidence)": lambda land, s: campaign_halving(land, "evidence", s),
    "Optuna TPE + SuccessiveHalvingPruner": optuna_halving,
    "Ray Tune ASHA": ray_asha,
}


def _interval(hits: int, total: int) -> tuple[float, float]:
    from scipy import stats

    if not total:
        return (math.nan, math.nan)
    found = stats.binomtest(hits, total).proportion_ci(0.95, method="exact")
    return float(found.low), float(found.high)


def simulate(searches: int) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows = {}
    for name, method in METHODS.items():
        began = time.perf_counter()
        best_hits, updates, confirm, wrong, audited, false_better = 0, [], [], [], [], 0
        audit_spent: list[int] = []
        covered: list[bool] = []  # per search: its audit's interval holds its true rate
        for search in range(searches):
            land = Landscape.draw(np.random.default_rng([search, 1]), null=False)
            outcome = method(land, search)
            best_hits += outcome.best == int(np.argmax(land.mu[:VARIANTS]))
            updates.append(outcome.updates)
            confirm.append(outcome.confirm_updates)
            audit_spent.append(outcome.audit_updates)
            wrong += outcome.pruned_wrong
            audited += outcome.audited_wrong
            if outcome.audited_wrong and outcome.pruned_wrong:  # this search's audit alone
                low, high = _interval(sum(outcome.audited_wrong), len(outcome.audited_wrong))
                truth = sum(outcome.pruned_wrong) / len(outcome.pruned_wrong)
                covered.append(low <= truth <= high)
            null = Landscape.draw(np.random.default_rng([search, 2]), null=True)
            false_better += method(null, search).better
        rows[name] = (best_hits / searches, float(np.mean(updates)), float(np.mean(audit_spent)),
                      float(np.mean(confirm)),
                      sum(wrong), len(wrong), sum(audited), len(audited),
                      false_better / searches, covered, time.perf_counter() - began)
    asha = rows["Ray Tune ASHA"][1]
    print(f"\nsimulation: {searches} searches per method, {VARIANTS} variants x {SEEDS} seeds, "
          f"budget {BUDGET}, rungs {RUNGS}, keep 1/{ETA}, audit {AUDIT[0]}")
    print(f"{'method':37s} {'P(best)':>7s} {'updates':>8s} {'vs ASHA':>8s} {'no audit':>9s} "
          f"{'+confirm':>8s} {'wrong-prune (true)':>22s} {'audit estimate':>22s} "
          f"{'covers':>7s} {'false better':>12s}")
    for name, (best, spent, audit_spent, confirm_spent, wrong, pruned, aw, an, false,
               covered, _) in rows.items():
        low, high = _interval(wrong, pruned)
        true = f"{wrong / pruned:.3f} [{low:.3f}, {high:.3f}]" if pruned else "-"
        if an:
            alow, ahigh = _interval(aw, an)
            audit = f"{aw / an:.3f} [{alow:.3f}, {ahigh:.3f}]"
            coverage = f"{sum(covered) / len(covered):.3f}" if covered else "-"
        else:
            audit, coverage = "-", "-"
        bare = (spent - audit_spent) / asha
        print(f"{name:37s} {best:7.3f} {spent:8.0f} {spent / asha:7.2f}x {bare:8.2f}x "
              f"{confirm_spent:8.0f} {true:>22s} {audit:>22s} {coverage:>7s} {false:12.3f}")
    print("covers: the share of searches whose own audit's exact 95% interval holds that "
          "search's true wrong-prune rate (over every pruned variant)")


def real(folder: Path) -> None:
    """Part 2: the digits grid against a halving search over it (one SQLite ledger)."""
    import json
    import subprocess

    grid = """
[campaign]
name = "{name}"
question = "Which learning rate, width and weight decay are best on digits?"
task = "campaign.tasks.digits:build"
[hold]
"loop.microbatch" = 32
"loop.accumulation" = 1
"budget.updates" = 60
[config]
"optimizer.name" = "adamw"
"optimizer.lr" = 1e-3
"optimizer.weight_decay" = 0.0
"task.hidden" = 32
[validation]
every = 10
metric = "val/accuracy"
mode = "max"
[grid]
seeds = [0, 1, 2]
control = "lr-1e-3_hidden-32_weight_decay-0"
[grid.axes]
"optimizer.lr" = [3e-4, 1e-3, 3e-3]
"task.hidden" = [16, 32, 64]
"optimizer.weight_decay" = [0.0, 0.1]
"""
    names = {"whole grid": "digits-grid", "halving search": "digits-halving"}
    search = """
[search]
method = "halving"
rungs = [10, 30]
keep = 0.34
audit = 0.3
confirm = 2
confirm_seeds = [10, 11, 12]
"""
    ledger = f"sqlite:///{folder / 'search-bench.db'}"
    results = {}
    for label, name in names.items():
        text = grid.format(name=name)
        if label == "halving search":
            text += search
        spec = folder / f"{name}.toml"
        spec.write_text(text)
        began = time.perf_counter()
        for args in (["plan", str(spec)], ["pilot", name],
                     ["launch", name, "--workers", "2", "--no-replay-check"]):
            done = subprocess.run([sys.executable, "-m", "campaign", "--ledger", ledger, *args],
                                  cwd=folder, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"{' '.join(args)}: {done.stderr[-2000:]}")
        report = subprocess.run([sys.executable, "-m", "campaign", "--ledger", ledger, "report",
                                 name, "--format", "json", "--output", "-"], cwd=folder,
                                capture_output=True, text=True, check=True)
        results[label] = (json.loads(report.stdout), time.perf_counter() - began)
    whole, _ = results["whole grid"]
    finals: dict[str, list[float]] = {}
    for run in whole["runs"]:
        if run["final_metric"] is not None:
            finals.setdefault(run["variant"], []).append(run["final_metric"])
    means = {v: float(np.mean(x)) for v, x in finals.items()}
    best = max(means.values())
    for label, (document, seconds) in results.items():
        spent = sum(r["updates_done"] for r in document["runs"])
        print(f"\nreal digits, {label}: {spent} updates, {seconds:.0f} s")
    searched = results["halving search"][0]["search"]
    confirm_updates = sum(r["updates_done"] for r in results["halving search"][0]["runs"]
                          if r["seed"] >= 10)
    chosen = searched["confirmation"]["chosen"]
    top = chosen[0] if chosen else None
    print(f"search's best {top}: grid mean {means.get(top, float('nan')):.4f} vs grid's best "
          f"{best:.4f} ({'within' if top and means[top] >= 0.99 * best else 'NOT within'} 1%); "
          f"confirmation took {confirm_updates} of those updates")
    survivors = [r for r in searched["variants"] if r["role"] in ("searched", "confirmed")]
    worst = min(means[r["variant"]] for r in survivors)
    pruned = [r["variant"] for r in searched["variants"] if r["role"] in ("pruned", "audit")]
    truth = [means[v] > worst for v in pruned]
    audit = searched["audit"]
    print(f"wrong-prune rate against the completed grid: {sum(truth)}/{len(truth)} = "
          f"{sum(truth) / max(1, len(truth)):.3f}; the audit measured {audit['wrong']}/"
          f"{audit['judged']} (95% interval {audit['interval']})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--searches", type=int, default=1000)
    parser.add_argument("--real", action="store_true", help="also part 2 (digits, ~3 min)")
    parser.add_argument("--audit", type=float, default=0.1, help="the halving's audit share")
    args = parser.parse_args()
    AUDIT[0] = args.audit
    random.seed(0)
    simulate(args.searches)
    if args.real:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            real(Path(folder))


if __name__ == "__main__":
    main()
