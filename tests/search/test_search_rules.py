"""The search's rules without training: a rung's decision under both rules, the seeded audit,
Holm's correction, and a re-plan whose space changed named by its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from campaign.ledger import Ledger
from campaign.search.rungs import decide, kept_count
from campaign.stats import holm
from tests.search.specs import plan_and_pilot, write_spec
from tests.support.launch_helpers import invoke

SEEDS = (0, 1, 2)


def _values(means: dict[str, float], noise: float = 0.01) -> dict[str, dict[int, float]]:
    return {v: {s: m + noise * (s - 1) for s in SEEDS} for v, m in means.items()}


def test_rank_rule_keeps_the_best_share_and_prunes_the_rest() -> None:
    values = _values({"a": 0.9, "b": 0.5, "c": 0.7, "d": 0.1})
    decided = {d.variant: d for d in decide(values, SEEDS, keep=0.5, rule="rank", mode="max",
                                            audit=0.0, audit_seed=1)}
    assert {v: d.outcome for v, d in decided.items()} == {
        "a": "kept", "b": "pruned", "c": "kept", "d": "pruned"}
    assert decided["a"].rank == 1 and decided["d"].rank == 4
    assert decided["b"].deltas == pytest.approx({"0": -0.4, "1": -0.4, "2": -0.4})
    # Lower is better with mode min: the order turns round.
    low = {d.variant: d.outcome for d in decide(values, SEEDS, keep=0.5, rule="rank",
                                                mode="min", audit=0.0, audit_seed=1)}
    assert low == {"a": "pruned", "b": "kept", "c": "pruned", "d": "kept"}
    assert kept_count(9, 1 / 3) == 3 and kept_count(2, 0.34) == 1


def test_evidence_rule_prunes_only_what_its_interval_says_is_worse() -> None:
    values = {"best": {0: 0.80, 1: 0.90, 2: 0.85},
              "close": {0: 0.86, 1: 0.79, 2: 0.84},  # no evidence: its deltas change sign
              "far": {0: 0.30, 1: 0.41, 2: 0.33}}
    decided = {d.variant: d for d in decide(values, SEEDS, keep=0.34, rule="evidence",
                                            mode="max", audit=0.0, audit_seed=1)}
    assert decided["best"].outcome == "kept"
    assert decided["close"].outcome == "kept" and "includes zero" in decided["close"].reason
    assert decided["far"].outcome == "pruned" and "excludes zero" in decided["far"].reason
    assert decided["far"].interval is not None and decided["far"].interval[1] < 0
    rank = {d.variant: d.outcome for d in decide(values, SEEDS, keep=0.34, rule="rank",
                                                 mode="max", audit=0.0, audit_seed=1)}
    assert rank["close"] == "pruned"  # what the rank rule would have done


def test_a_variant_without_a_value_is_pruned_and_never_audited() -> None:
    values = _values({"a": 0.9, "b": 0.5, "c": 0.4})
    values["b"][1] = None  # type: ignore[assignment]
    decided = {d.variant: d for d in decide(values, SEEDS, keep=0.34, rule="rank", mode="max",
                                            audit=0.99, audit_seed=3)}
    assert decided["b"].outcome == "pruned" and decided["b"].rank is None
    assert "no value at the rung for seed 1" in decided["b"].reason
    assert decided["c"].outcome == "audit"  # the only pruned variant with values


def test_the_audit_is_a_seeded_equal_chance_draw_among_the_pruned() -> None:
    values = _values({f"v{i:02d}": i / 100 for i in range(100)})
    first = decide(values, SEEDS, keep=0.2, rule="rank", mode="max", audit=0.25, audit_seed=7)
    again = decide(values, SEEDS, keep=0.2, rule="rank", mode="max", audit=0.25, audit_seed=7)
    assert first == again
    audited = {d.variant for d in first if d.outcome == "audit"}
    assert 10 <= len(audited) <= 30  # about a quarter of the 80 pruned
    assert all(int(v[1:]) < 80 for v in audited)  # never a kept one
    other = {d.variant for d in decide(values, SEEDS, keep=0.2, rule="rank", mode="max",
                                       audit=0.25, audit_seed=8) if d.outcome == "audit"}
    assert other != audited  # the seed picks which
    none = decide(values, SEEDS, keep=0.2, rule="rank", mode="max", audit=0.0, audit_seed=7)
    assert not any(d.outcome == "audit" for d in none)


def test_holm_adjusts_step_down_and_never_decreases() -> None:
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert adjusted == pytest.approx({"a": 0.03, "c": 0.06, "b": 0.06})
    assert holm({"a": 0.6, "b": 0.7}) == pytest.approx({"a": 1.0, "b": 1.0})


def test_a_search_replanned_with_another_space_is_refused_naming_the_key(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, "space-changed")
    assert invoke(sqlite_url, "plan", str(spec)).returncode == 0
    before = len(sqlite_ledger.runs("space-changed"))
    changed = write_spec(tmp_path, "space-changed", **{"3e-2": "1e-2"})
    done = invoke(sqlite_url, "plan", str(changed))
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    changed_words = 'search.space."optimizer.lr".log_uniform changed'
    assert len(lines) == 1 and changed_words in lines[0], done.stderr
    assert len(sqlite_ledger.runs("space-changed")) == before


def test_the_example_search_plans(sqlite_url: str) -> None:
    from tests.support.launch_helpers import ROOT

    done = invoke(sqlite_url, "plan", str(ROOT / "examples" / "digits-search.toml"),
                  "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "digits-search" in done.stderr


@pytest.mark.slow
def test_a_run_paused_at_an_undecided_rung_is_not_resumed_by_hand(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    """A worker stopped after one run leaves it paused at its rung; `campaign resume` or
    `campaign relaunch` of it is refused (one line, nothing changed): only the rung's decision
    continues it."""
    spec = write_spec(tmp_path, "paused")
    plan_and_pilot(sqlite_url, spec, "paused", tmp_path / "p")
    runs = sqlite_ledger.runs("paused")
    control = set(runs["run_id"])
    artifacts = str(tmp_path / "a")
    done = invoke(sqlite_url, "worker", "paused", "--max-runs", "4", "--artifacts", artifacts,
                  "--no-replay-check")
    assert done.returncode == 0, done.stderr[-2000:]
    runs = sqlite_ledger.runs("paused")
    paused = runs[~runs["run_id"].isin(control) & (runs["status"] == "interrupted")]
    assert len(paused) == 1
    run = paused.iloc[0]
    assert run["stop_cause"] == "preempted" and int(run["stop_step"]) == 10
    assert run["stop_detail"].startswith("search: paused at rung 10")
    refused = invoke(sqlite_url, "resume", run["run_id"], "--artifacts", artifacts)
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "waits at rung 10" in lines[0], refused.stderr
    after = sqlite_ledger.run(run["run_id"])
    assert (after.status, after.stop_step) == ("interrupted", 10)
    # Nor relaunched: the original would wait at its rung for good.
    refused = invoke(sqlite_url, "relaunch", run["run_id"], "--reason", "a second look")
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "is paused at rung 10 of its search" in lines[0]
    assert len(sqlite_ledger.runs("paused")) == len(runs)


def test_a_verdict_holm_withholds_says_its_interval_is_uncorrected() -> None:
    """Three confirmed comparisons, each of whose own interval excludes zero (p near 0.03),
    none beyond noise once corrected for the others: the conclusion must not print an
    interval that excludes zero beside "within noise" without saying it is uncorrected."""
    import pandas as pd

    from campaign.report.conclusions import campaign_conclusion, conclusions
    from campaign.report.search_section import holm_verdicts

    found = {"t0": [0.15, 0.2, 0.25], "t1": [0.16, 0.21, 0.26], "t2": [0.13, 0.18, 0.23]}
    deltas = pd.DataFrame([{"variant": v, "seed": s, "delta": d}
                           for v, values in found.items() for s, d in enumerate(values)])
    variants = pd.DataFrame([{"variant": v, "is_control": v == "base", "n": 3, "planned": 3}
                             for v in ("base", *found)])
    table = conclusions(variants, deltas, pd.DataFrame(columns=["variant"]), "max")
    assert set(table["verdict"]) == {"better"} and (table["ci_low"] > 0).all()
    table, tests = holm_verdicts(table, deltas, "max")
    assert set(table["verdict"]) == {"within_noise"}
    assert all(tests[v]["p"] < 0.05 <= tests[v]["p_holm"] for v in found)
    text = campaign_conclusion("q?", "base", table, "val/acc", "max", 0, 0)
    assert "No variant differs from the control base beyond noise" in text
    for variant in found:
        assert f"{variant}: within noise after Holm's correction, +0." in text
    assert "p = 0.0" in table["reason"].iloc[0] and "Holm" in table["reason"].iloc[0]
    assert text.count("(uncorrected 95%)") == 3


def test_a_cohort_past_the_trials_is_one_cohort_of_every_trial() -> None:
    from campaign.plan.search_spec import search_plan

    section = {"method": "tpe", "trials": 3, "space": {"optimizer.lr": {"uniform": [0.1, 0.2]}}}
    document = {"grid": {"seeds": [0, 1, 2]}, "search": section}
    assert search_plan(document).cohort == 3  # tpe's default of 4, past 3 trials
    plan = search_plan({**document, "search": {**section, "cohort": 10}})
    assert (plan.cohort, plan.cohorts) == (3, 1)


def test_a_searched_variants_legend_says_why_it_has_no_confirmation_mean() -> None:
    import pandas as pd

    from campaign.report.plots import search_label

    search = {"search_seeds": [0, 1, 2], "confirmation": {"chosen": []}}
    runs = pd.DataFrame({"seed": [0, 1, 2], "is_control": [False] * 3})
    assert search_label(search, "t1", runs) == "search runs (3)"  # the search goes on
    search["confirmation"]["chosen"] = ["t2"]
    assert search_label(search, "t1", runs) == "search runs (3), not confirmed"
    chosen = pd.DataFrame({"seed": [0, 1, 2, 10, 11, 12], "is_control": [False] * 6})
    assert search_label(search, "t2", chosen) == "search runs (3), confirmation pending"
    control = runs.assign(is_control=True)
    assert search_label(search, "base", control) == "search runs (3), confirmation pending"
