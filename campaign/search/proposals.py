"""A cohort's proposals from Optuna's own samplers (random, TPE), fed from the ledger.

The sampler is built fresh for each cohort, seeded with the search's seed and the cohort's
number, and told every earlier trial as the ledger holds it: a trial whose search runs all
completed is ``COMPLETE`` with the mean of their final values; a pruned (or audited, still
running) trial is ``PRUNED`` with its mean at each rung it reached, as Optuna's own pruners
leave a trial for TPE; a trial with a seed that diverged or failed is ``FAIL``. A cohort is
only proposed once the cohorts before it have ended, so its proposals are a function of
results that never change: a launcher restarted mid-search proposes the same variants.
"""

from __future__ import annotations

from typing import Any

from campaign.plan.search_spec import Distribution
from campaign.search.state import SearchState


def distributions(space: dict[str, Distribution]) -> dict[str, Any]:
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    made: dict[str, Any] = {}
    for key, distribution in space.items():
        values = distribution.values
        if distribution.kind == "choice":
            made[key] = CategoricalDistribution(values)
        elif distribution.kind == "int":
            made[key] = IntDistribution(int(values[0]), int(values[1]))
        else:
            made[key] = FloatDistribution(float(values[0]), float(values[1]),
                                          log=distribution.kind == "log_uniform")
    return made


def trial_name(number: int) -> str:
    return f"trial-{number:03d}"


def propose(state: SearchState, cohort: int) -> list[dict[str, Any]]:
    """The proposals of ``cohort``: ``{variant, cohort, trial, sampler, seed, params}`` each."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    plan = state.plan
    seed = (plan.seed * 1_000_003 + cohort) % 2**32
    if plan.sampler == "tpe":
        sampler: Any = optuna.samplers.TPESampler(seed=seed, n_startup_trials=plan.cohort)
    else:
        sampler = optuna.samplers.RandomSampler(seed=seed)
    study = optuna.create_study(sampler=sampler,
                                direction="maximize" if state.mode == "max" else "minimize")
    space = distributions(plan.space)
    for proposal in sorted(state.proposals, key=lambda p: p["trial"]):
        if proposal["cohort"] < cohort:
            study.add_trial(_told(state, proposal, space))
    first = cohort * plan.cohort
    count = min(plan.cohort, plan.trials - first)
    taken = set(state.runs["variant"])
    made = []
    for offset in range(count):
        trial = study.ask(space)
        number = first + offset
        name = trial_name(number)
        while name in taken:  # a grid variant of that name: the proposal's is marked
            name += "-s"
        made.append({"variant": name, "cohort": cohort, "trial": number,
                     "sampler": plan.sampler, "seed": seed,
                     "params": {k: _plain(v) for k, v in trial.params.items()}})
    return made


def _plain(value: Any) -> Any:
    """JSON's own types (numpy's ints and floats are not)."""
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int) or (hasattr(value, "dtype") and "int" in str(value.dtype)):
        return int(value)
    return float(value)


def _told(state: SearchState, proposal: dict[str, Any], space: dict[str, Any]) -> Any:
    """An earlier trial as Optuna records one (its state, value and rung values)."""
    from optuna.trial import TrialState, create_trial

    variant = proposal["variant"]
    runs = state.search_runs(variant)
    params = {k: proposal["params"][k] for k in space}
    finals = [state.final(r) for r in runs.itertuples()]
    if len(runs) and all(f is not None for f in finals):
        return create_trial(params=params, distributions=space,
                            value=sum(finals) / len(finals))  # type: ignore[arg-type]
    rungs: dict[int, float] = {}
    for rung in state.plan.rungs:
        at = [state.value(r.run_id, rung) for r in runs.itertuples()]
        if len(at) and all(v is not None for v in at):
            rungs[rung] = sum(at) / len(at)  # type: ignore[arg-type]
    if state.pruned(variant) and rungs:
        return create_trial(params=params, distributions=space, state=TrialState.PRUNED,
                            intermediate_values=rungs)
    return create_trial(params=params, distributions=space, state=TrialState.FAIL)
