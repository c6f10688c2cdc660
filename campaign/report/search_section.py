"""A search's part of the report (docs/report.md, "Searches", contract names): the space it
explored, each rung's decisions with what they saw, the audit's measured wrong-prune rate,
and the confirmation, where the search's estimate of each chosen variant stands beside the
estimate from fresh seeds (the difference is what selection added: the winner's curse).

The conclusion of a search comes from its confirmation runs alone, every confirmed
comparison corrected for the others (Holm): :func:`holm_verdicts` rewrites the verdicts the
paired intervals gave.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from campaign.search.state import SearchState
from campaign.stats import holm, paired_p

ALPHA = 0.05
HOLM = "Holm-adjusted paired Student t"


def holm_verdicts(verdicts: pd.DataFrame, deltas: pd.DataFrame,
                  mode: str) -> tuple[pd.DataFrame, dict[str, dict[str, float | None]]]:
    """The confirmation's verdicts with every comparison corrected for the others: better or
    worse only where the Holm-adjusted p is under 0.05; and (p, adjusted p) per variant."""
    sign = 1.0 if mode == "max" else -1.0
    found: dict[str, float] = {}
    for variant in verdicts["variant"]:
        mine = deltas[(deltas["variant"] == variant) & deltas["delta"].notna()]
        p = paired_p([float(d) for d in mine["delta"]])
        if p is not None:
            found[variant] = p
    adjusted = holm(found)
    table = verdicts.copy()
    for index, row in table.iterrows():
        p, q = found.get(row["variant"]), adjusted.get(row["variant"])
        if q is None or row["verdict"] == "no_valid_runs":
            continue
        words = (f"p = {p:.3g}, {HOLM} over {len(found)} confirmed comparison"
                 f"{'s' * (len(found) > 1)}: {q:.3g}")
        if q < ALPHA and row["mean_delta"] is not None:
            table.at[index, "verdict"] = "better" if sign * row["mean_delta"] > 0 else "worse"
            table.at[index, "reason"] = f"{words} < {ALPHA}"
        else:
            table.at[index, "verdict"] = "within_noise"
            table.at[index, "reason"] = f"{words} ≥ {ALPHA}"
    return table, {v: {"p": found.get(v), "p_holm": adjusted.get(v)} for v in table["variant"]}


def search_section(state: SearchState, verdicts: pd.DataFrame,
                   tests: dict[str, dict[str, float | None]]) -> dict[str, Any]:
    """The report's ``search`` object (JSON names in docs/report.md)."""
    plan = state.plan
    rows = explored(state)
    return {
        "method": plan.method, "sampler": plan.sampler, "rule": plan.rule if plan.halving
        else None, "rungs": list(plan.rungs), "keep": plan.keep if plan.halving else None,
        "audit_share": plan.audit, "confirm": plan.confirm, "trials": plan.trials or None,
        "search_seeds": list(plan.search_seeds), "confirm_seeds": list(plan.confirm_seeds),
        "space": {k: {d.kind: d.values} for k, d in plan.space.items()},
        "variants": rows,
        "decisions": [{k: d[k] for k in ("variant", "cohort", "rung", "outcome", "rank", "mean",
                                         "against", "interval", "rule", "reason")}
                      for d in sorted(state.decisions, key=lambda d: (d["cohort"], d["rung"],
                                                                      d["rank"] or 10**9))],
        "audit": audit(state, rows),
        "confirmation": confirmation(state, verdicts, tests),
    }


def _role(state: SearchState, variant: str) -> str:
    if variant == state.control:
        return "control"
    if state.audited(variant):
        return "audit"
    if state.pruned(variant):
        return "pruned"
    chosen = (state.confirmation or {}).get("chosen") or []
    return "confirmed" if variant in chosen else "searched"


def _mean(values: list[float | None]) -> float | None:
    return sum(values) / len(values) if values and all(v is not None for v in values) \
        else None  # type: ignore[arg-type]


def explored(state: SearchState) -> list[dict[str, Any]]:
    """Each searched variant: its values of the space's keys, its role, the last rung it
    reached with its mean there, and its mean final value over the search seeds (completed
    runs only: a pruned variant has none, it is drawn apart)."""
    params = {p["variant"]: p["params"] for p in state.proposals}
    rows = []
    for variant in dict.fromkeys(state.search_runs()["variant"]):
        runs = list(state.search_runs(variant).itertuples())
        overrides = params.get(variant) or _overrides(state, runs)
        reached, at_rung = None, None
        for rung in state.plan.rungs:
            mean = _mean([state.value(r.run_id, rung) for r in runs])
            if mean is not None:
                reached, at_rung = rung, mean
        rows.append({"variant": variant, "role": _role(state, variant),
                     "cohort": state.cohort_of(variant), "params": overrides,
                     "last_rung": reached, "rung_mean": at_rung,
                     "final_mean": _mean([state.final(r) for r in runs]),
                     "statuses": ", ".join(sorted({str(r.status) for r in runs}))})
    return rows


def _overrides(state: SearchState, runs: list[Any]) -> dict[str, Any]:
    """A grid variant's values of the keys the grid varies (read from its frozen config)."""
    from campaign.plan.config_keys import config_value

    keys = state.plan.space or searched_keys(state)
    return {} if not runs else {k: config_value(runs[0].config, k) for k in keys}


def searched_keys(state: SearchState) -> list[str]:
    grid = state.spec.get("grid") or {}
    keys = [k for v in grid.get("variants") or [] for k in (v.get("set") or {})]
    return list(dict.fromkeys([*keys, *(grid.get("axes") or {})]))


def audit(state: SearchState, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The measured wrong-prune rate: an audited variant was pruned wrongly when its final
    mean beats the final mean of a variant of its cohort that survived every rung (pruning
    kept a worse one); one that diverged or failed on its way to the end was pruned rightly.
    Its exact (Clopper-Pearson) 95% interval over the audited variants that have ended."""
    sign = 1.0 if state.mode == "max" else -1.0
    survivors: dict[int, list[float]] = {}
    for row in rows:
        if row["role"] in ("searched", "confirmed") and row["final_mean"] is not None:
            survivors.setdefault(row["cohort"], []).append(row["final_mean"])
    audited = [r for r in rows if r["role"] == "audit"]
    judged = []
    for row in audited:
        worst = min((sign * v for v in survivors.get(row["cohort"], [])), default=None)
        unended = {"planned", "running", "interrupted", "lost"} & set(row["statuses"].split(", "))
        if worst is None or (row["final_mean"] is None and unended):
            judged.append({"variant": row["variant"], "final_mean": row["final_mean"],
                           "worst_survivor": None, "wrong": None})  # not yet, or no survivor
            continue
        if row["final_mean"] is None:  # it diverged or failed on its way: pruned rightly
            judged.append({"variant": row["variant"], "final_mean": None,
                           "worst_survivor": sign * worst, "wrong": False})
            continue
        judged.append({"variant": row["variant"], "final_mean": row["final_mean"],
                       "worst_survivor": sign * worst, "wrong": sign * row["final_mean"] > worst})
    decided = [j for j in judged if j["wrong"] is not None]
    wrong = sum(bool(j["wrong"]) for j in decided)
    pruned = sum(1 for r in rows if r["role"] in ("pruned", "audit"))
    interval = None
    if decided:
        from scipy import stats

        found = stats.binomtest(wrong, len(decided)).proportion_ci(0.95, method="exact")
        interval = [float(found.low), float(found.high)]
    return {"pruned": pruned, "audited": len(audited), "judged": len(decided), "wrong": wrong,
            "rate": wrong / len(decided) if decided else None, "interval": interval,
            "method": "Clopper-Pearson exact 95%", "variants": judged}


def confirmation(state: SearchState, verdicts: pd.DataFrame,
                 tests: dict[str, dict[str, float | None]]) -> dict[str, Any]:
    found = state.confirmation
    if found is None:
        return {"chosen": [], "rows": [], "reason": "not yet: the search has not ended"}
    rows = []
    by_variant = verdicts.set_index("variant") if len(verdicts) else None
    for variant in found["chosen"]:
        search = found["estimates"].get(variant, {})
        line = by_variant.loc[variant] if by_variant is not None and variant in \
            by_variant.index else None
        confirm = None if line is None or pd.isna(line["mean_delta"]) else float(
            line["mean_delta"])
        searched = search.get("mean_delta")
        rows.append({
            "variant": variant, "search_delta": searched, "search_pairs": search.get("pairs"),
            "confirm_delta": confirm,
            "confirm_pairs": None if line is None else int(line["pairs"]),
            "ci_low": None if line is None or _none(line["ci_low"]) else float(line["ci_low"]),
            "ci_high": None if line is None or _none(line["ci_high"]) else float(
                line["ci_high"]),
            "p": tests.get(variant, {}).get("p"), "p_holm": tests.get(variant, {}).get("p_holm"),
            "verdict": None if line is None else line["verdict"],
            "selection": None if searched is None or confirm is None else searched - confirm})
    return {"chosen": list(found["chosen"]), "candidates": found["candidates"],
            "reason": found["reason"], "rows": rows}


def _none(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def unconfirmed(state: SearchState, confirmation_runs: pd.DataFrame) -> str | None:
    """Why a search has no conclusion yet, or None when its confirmation runs are there."""
    if not state.plan.confirm:
        return ("a search without confirmation (search.confirm = 0) names its best variant, "
                "but the best of many noisy values overstates it: no conclusion is drawn")
    if confirmation_runs.empty:
        return ("a search's conclusion comes from its confirmation runs on fresh seeds "
                "(search.confirm_seeds) alone, and they are planned once the search ends")
    return None


def confirmed_words(search: dict[str, Any]) -> str:
    count = len(search["confirmation"]["chosen"])
    return (f" Drawn from the confirmation runs on fresh seeds alone (seeds "
            f"{', '.join(map(str, search['confirm_seeds']))}), each verdict {HOLM} over "
            f"{count} confirmed comparison{'s' * (count != 1)}.")


def search_words(search: dict[str, Any]) -> tuple[str, str]:
    """(the search's settings in one line, the audit's finding in words)."""
    audit = search["audit"]
    if audit["judged"]:
        low, high = audit["interval"]
        audit_words = (f"{audit['audited']} of {audit['pruned']} pruned variants were audited "
                       f"(continued to the full budget, out of every conclusion); "
                       f"{audit['wrong']} of {audit['judged']} would have survived to the end: "
                       f"wrong-prune rate {audit['rate']:.0%}, 95% interval "
                       f"[{low:.0%}, {high:.0%}] ({audit['method']}).")
    elif not search["rule"]:
        audit_words = f"Method {search['method']} prunes nothing: there is nothing to audit."
    elif audit["audited"]:  # running, or its cohort left no survivor to compare it with
        audit_words = (f"No audited variant has been judged ({audit['pruned']} pruned, "
                       f"{audit['audited']} audited, judged once it and a survivor of its "
                       f"cohort end; search.audit = {search['audit_share']}).")
    else:  # none drawn (the share, or chance), or every pruned one without a value
        audit_words = (f"No pruned variant was audited ({audit['pruned']} pruned; search.audit "
                       f"= {search['audit_share']}): the wrong-prune rate is not measured.")
    rungs = ", ".join(map(str, search["rungs"])) or "none"
    summary = (f"method {search['method']}"
               + (f", sampler {search['sampler']}" if search["sampler"] else "")
               + (f", rule {search['rule']}, rungs {rungs}, keep {search['keep']}"
                  if search["rule"] else "")
               + f"; search seeds {search['search_seeds']}, confirmation seeds "
               f"{search['confirm_seeds']}; {len(search['variants'])} variants searched.")
    return summary, audit_words


def search_frames(search: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """The section's tables: ``confirmation``, ``variants`` (the space explored, one column
    per searched key) and ``decisions`` (the interval as text)."""
    explored = pd.DataFrame([{**{k: v for k, v in r.items() if k != "params"}, **r["params"]}
                             for r in search["variants"]])
    decisions = pd.DataFrame([
        {**d, "interval": "" if not d["interval"] else
         f"[{d['interval'][0]:+.3g}, {d['interval'][1]:+.3g}]"} for d in search["decisions"]])
    return {"confirmation": pd.DataFrame(search["confirmation"]["rows"]),
            "variants": explored, "decisions": decisions}
