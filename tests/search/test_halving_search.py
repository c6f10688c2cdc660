"""A halving search end to end on the digits task, on SQLite and PostgreSQL across 2 workers:
proposals from Optuna's sampler, rungs decided once, pruned runs ended stopped/pruned at
their rung with their decision, an audit run to the end, and the conclusion drawn from the
confirmation seeds only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from campaign.ledger import Ledger
from tests.search.specs import plan_and_pilot, write_spec
from tests.support.launch_helpers import invoke


@pytest.mark.slow
def test_halving_search_prunes_audits_and_concludes_from_confirmation(
    ledger: Ledger, ledger_url: str, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, "digits-search")
    plan_and_pilot(ledger_url, spec, "digits-search", tmp_path / "pilots")
    done = invoke(ledger_url, "launch", "digits-search", "--workers", "2", "--artifacts",
                  str(tmp_path / "artifacts"), "--no-replay-check")
    assert done.returncode == 0, done.stderr[-3000:]

    runs = ledger.runs("digits-search")
    search = runs[runs["seed"].isin([0, 1, 2])]
    confirm = runs[runs["seed"].isin([10, 11, 12])]
    assert set(runs["status"]) <= {"completed", "stopped"}
    control = search[search["variant"] == "base"]
    assert list(control["status"]) == ["completed"] * 3  # the control is never pruned
    assert search["variant"].nunique() == 7  # the control and 6 proposals

    events = ledger.events("digits-search")
    decisions = [json.loads(d) for d in events[events["kind"] == "search_decision"]["detail"]]
    proposals = [json.loads(d) for d in events[events["kind"] == "search_proposal"]["detail"]]
    assert [p["trial"] for p in proposals] == list(range(6))
    assert {p["sampler"] for p in proposals} == {"random"}
    # One decision per variant per rung, never two.
    keys = [(d["variant"], d["rung"]) for d in decisions]
    assert len(keys) == len(set(keys))
    assert len([d for d in decisions if d["rung"] == 10]) == 6

    # A proposal of another width is another gate class: piloted before its runs trained.
    narrow = {p["variant"] for p in proposals if p["params"]["task.hidden"] == 16}
    assert narrow, "the seeded sampler proposes both widths"
    pilots = ledger.pilots("digits-search")
    assert len(pilots) == 2 and set(pilots["verdict"]) == {"pass"}
    first_narrow = runs[runs["variant"].isin(narrow)]["started_at"].min()
    assert pilots["created_at"].max() < first_narrow

    pruned = runs[runs["stop_cause"] == "pruned"]
    assert len(pruned) >= 3 and set(pruned["status"]) == {"stopped"}
    artifacts = ledger.artifacts("digits-search")
    for run in pruned.itertuples():
        mine = [d for d in decisions if d["variant"] == run.variant and d["outcome"] == "pruned"]
        assert len(mine) == 1 and mine[0]["rung"] == run.stop_step, run.variant
        assert run.stop_detail.startswith("search: rank")
        assert mine[0]["values"] and mine[0]["reason"]
        # Its checkpoint at the rung is kept (a later look is a relaunch from it).
        kept = artifacts[(artifacts["run_id"] == run.run_id)
                         & (artifacts["kind"] == "checkpoint")]
        assert int(run.stop_step) in set(kept["step"])
        assert ledger.latest_steps([run.run_id])[run.run_id] == run.stop_step

    audited = {d["variant"] for d in decisions if d["outcome"] == "audit"}
    assert audited
    for variant in audited:  # audit runs continue to the full budget
        assert set(search[search["variant"] == variant]["status"]) == {"completed"}

    confirmation = json.loads(events[events["kind"] == "search_confirmation"]["detail"].iloc[0])
    assert confirmation["chosen"] and not set(confirmation["chosen"]) & audited
    assert set(confirm["variant"]) == {"base", *confirmation["chosen"]}
    assert set(confirm["status"]) == {"completed"} and len(confirm) == 3 * (
        1 + len(confirmation["chosen"]))

    report = invoke(ledger_url, "report", "digits-search", "--format", "json", "--output", "-")
    assert report.returncode == 0, report.stderr[-2000:]
    document = json.loads(report.stdout)
    # The conclusion pairs the confirmation seeds only.
    for line in document["variants"]:
        assert set(line["values"]) == {"10", "11", "12"}
    assert {c["variant"] for c in document["conclusions"]} == set(confirmation["chosen"])
    assert all(c["pairs"] == 3 for c in document["conclusions"])
    assert "Holm" in document["conclusion"] and "confirmation runs" in document["conclusion"]
    section = document["search"]
    assert section["audit"]["audited"] == len(audited)
    assert section["audit"]["judged"] == len(audited)
    assert 0 <= section["audit"]["interval"][0] <= section["audit"]["interval"][1] <= 1
    rows = {r["variant"]: r for r in section["confirmation"]["rows"]}
    assert set(rows) == set(confirmation["chosen"])
    for row in rows.values():
        assert row["search_pairs"] == 3 and row["confirm_pairs"] == 3
        assert row["selection"] == pytest.approx(row["search_delta"] - row["confirm_delta"])
    # Every run keeps its line in the report, the pruned ones too.
    assert len(document["runs"]) == len(runs)
    assert sum(r["stop_cause"] == "pruned" for r in document["runs"]) == len(pruned)

    html = tmp_path / "report.html"
    done = invoke(ledger_url, "report", "digits-search", "--output", str(html))
    assert done.returncode == 0, done.stderr[-2000:]
    page = html.read_text()
    assert 'id="search"' in page and "Audit of pruning" in page
    assert 'alt="the searched keys against val/accuracy" src="data:image/png;base64,' in page
