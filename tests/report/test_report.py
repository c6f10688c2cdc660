"""The balance sheet and its exports: every run in every format, user text escaped."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from campaign import Ledger as NotebookLedger
from campaign.cli import main
from campaign.ledger import Ledger, StopRecord
from campaign.loop.train import execute
from campaign.plan.grid import make_plan, record_plan
from campaign.plan.spec import resolve_spec
from campaign.report.balance import balance_sheet
from tests.conftest import _at_head
from tests.support.helpers import plan_campaign

HOSTILE = "<script>alert(1)</script>"
Mixed = tuple[str, Ledger, dict[str, str]]  # the mixed campaign's URL, ledger, expected statuses
FAULTS = {"nan": "diverged", "raise": "failed", "oom": "oom", "sigterm": "interrupted"}


def _plan_mixed(ledger: Ledger, tmp_path: Path) -> dict[str, str]:
    """A campaign whose runs end in every way; returns {run_id: expected status}."""
    spec = {
        "campaign": {"name": "mixed", "question": f"does every run keep its line? {HOSTILE}",
                     "task": "tests.support.tasks.faulty:build"},
        "hold": {"loop.microbatch": 4, "loop.accumulation": 2, "budget.updates": 8},
        "config": {"optimizer.name": "adamw", "optimizer.lr": 1e-2, "task.limit": 300,
                   "task.at": 9, "task.marker": str(tmp_path / "sigterm-once")},
        "validation": {"every": 4, "metric": "val/accuracy", "mode": "max"},
        "stop": {"loss_explosion": 4.0},
        "grid": {"seeds": [0, 1], "control": "control",
                 "variants": [{"name": "control"}, {"name": "bold", "set": {"optimizer.lr": 2e-2}},
                              *({"name": f, "set": {"task.fault": f}} for f in FAULTS)]},
    }
    record, _ = record_plan(ledger, make_plan(resolve_spec(spec, "<mixed>")))
    runs = ledger.runs("mixed").set_index("run_id")
    expected = {}
    for run_id in record.run_ids:
        variant, seed = runs.loc[run_id, "variant"], int(runs.loc[run_id, "seed"])
        if variant == "sigterm" and seed == 1:
            expected[run_id] = "planned"  # never launched: still counted
            continue
        outcome = execute(ledger, run_id, artifacts=tmp_path / "artifacts",
                          replay_in_subprocess=False)
        expected[run_id] = outcome.status
        assert outcome.status == FAULTS.get(variant, "completed"), (variant, outcome)
    failed = next(r for r, s in expected.items() if s == "failed")
    config = runs.loc[failed, "config"]
    fixed = {**config, "task": {**config["task"], "fault": None}}
    relaunch = ledger.add_run("mixed", "raise", 0, fixed, relaunch_of=failed,
                              reason="fixed the loss")
    expected[relaunch] = "planned"
    ledger.add_note("mixed", f"seed 1 of sigterm left for later {HOSTILE}")
    return expected


@pytest.fixture(scope="module")
def mixed_campaign(request: pytest.FixtureRequest,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mixed]:
    """The mixed campaign trained once for the tests that only read it: its URL, the open
    ledger and {run_id: expected status}."""
    folder = tmp_path_factory.mktemp("mixed")
    url = _at_head(request, f"sqlite:///{folder / 'ledger.db'}")
    with Ledger.open(url) as ledger:
        yield url, ledger, _plan_mixed(ledger, folder)


@pytest.mark.slow
def test_every_run_keeps_its_line_and_counts_add_up(
    mixed_campaign: Mixed,
) -> None:
    _, sqlite_ledger, mixed = mixed_campaign
    sheet = balance_sheet(sqlite_ledger, "mixed")
    runs = sheet.runs.set_index("run_id")
    assert sorted(runs.index) == sorted(mixed)
    assert runs["status"].to_dict() == mixed
    assert set(runs.loc[[r for r, s in mixed.items() if s == "diverged"], "stop_cause"]) == {
        "non_finite_loss"}
    assert set(runs[runs["status"] == "oom"]["stop_cause"]) == {"out_of_memory"}
    variants = sheet.variants.set_index("variant")
    assert int(variants["planned"].sum()) == len(mixed) - 1  # originals only
    counted = variants[["completed", "diverged", "failed", "other"]].astype(int)
    assert counted.to_dict("index") == {  # what each variant's runs did, by construction
        "control": {"completed": 2, "diverged": 0, "failed": 0, "other": 0},
        "bold": {"completed": 2, "diverged": 0, "failed": 0, "other": 0},
        "nan": {"completed": 0, "diverged": 2, "failed": 0, "other": 0},
        "raise": {"completed": 0, "diverged": 0, "failed": 2, "other": 0},
        "oom": {"completed": 0, "diverged": 0, "failed": 0, "other": 2},
        "sigterm": {"completed": 0, "diverged": 0, "failed": 0, "other": 2},  # one never ran
    }
    # The relaunch of a failed "raise" run is not pooled: the variant counts its two seeds.
    assert variants.loc["raise", "planned"] == 2 and variants.loc["raise", "failed"] == 2
    assert variants.loc["raise", "relaunches"] == 1 and variants.loc["raise", "n"] == 0
    missing = variants.loc["raise", "missing"]  # why each seed has no value, in words
    assert set(missing) == {"0", "1"}
    assert all(m.startswith("failed: exception at update ") for m in missing.values())
    control = variants.loc["control"]
    finals = {}  # each control seed's value: its last val/accuracy point, read apart
    for run_id in runs.index[(runs["variant"] == "control")]:
        points = sqlite_ledger.metrics("mixed", keys=["val/accuracy"], runs=[run_id])
        finals[str(runs.loc[run_id, "seed"])] = float(points.sort_values("step")["value"].iloc[-1])
    assert control["values"] == pytest.approx(finals)  # every seed, not only the best
    assert control["n"] == 2 and control["mean"] == pytest.approx(sum(finals.values()) / 2)
    assert (control["min"], control["max"]) == (min(finals.values()), max(finals.values()))
    deltas = sheet.deltas[sheet.deltas["variant"] == "bold"].set_index("seed")
    assert sorted(deltas.index) == [0, 1]
    for _, row in deltas.iterrows():
        assert row["delta"] == pytest.approx(row["metric"] - row["control"])
    relaunch = runs[runs["relaunch_of"].notna()]
    assert len(relaunch) == 1 and relaunch["relaunch_reason"].iloc[0] == "fixed the loss"
    completed = runs[runs["status"] == "completed"]
    assert (completed["updates_done"] == 8).all() and (completed["wall_time_s"] > 0).all()
    assert completed["final_metric"].notna().all() and completed["peak_rss_bytes"].notna().all()
    assert NotebookLedger(sqlite_ledger.engine).balance("mixed").runs.equals(sheet.runs)


def test_every_export_format_holds_every_run(
    mixed_campaign: Mixed, tmp_path: Path
) -> None:
    sqlite_url, _, mixed = mixed_campaign
    outputs = {}
    for fmt in ("html", "md", "csv", "parquet", "json"):
        path = tmp_path / f"report.{fmt}"
        result = CliRunner().invoke(main, ["--ledger", sqlite_url, "report", "mixed",
                                           "--format", fmt, "--output", str(path)])
        assert result.exit_code == 0, result.stderr
        outputs[fmt] = path
    tables = {
        "csv": pd.read_csv(outputs["csv"]),
        "parquet": pd.read_parquet(outputs["parquet"]),
        "json": pd.DataFrame(json.loads(outputs["json"].read_text())["runs"]),
    }
    for fmt, table in tables.items():
        assert dict(zip(table["run_id"], table["status"], strict=True)) == mixed, fmt
    document = json.loads(outputs["json"].read_text())
    assert {"campaign", "variants", "deltas", "phases", "notes"} <= set(document)
    assert document["notes"][0]["text"] == f"seed 1 of sigterm left for later {HOSTILE}"
    html_rows = outputs["html"].read_text().split("<tr")
    md_rows = outputs["md"].read_text().split("## Every run")[1].split("## ")[0].splitlines()
    for run_id, status in mixed.items():  # the run's own row carries its status
        (row,) = [r for r in html_rows if r.startswith(f' class="{status}"')
                  and r.split("<td>")[1].startswith(f"{run_id[-8:]}</td>")]
        assert f"<td>{status}</td>" in row
        (line,) = [x for x in md_rows if x.startswith(f"| {run_id} |")]
        assert f"| {status} |" in line
    for fmt in ("html", "md"):
        text = outputs[fmt].read_text()
        assert text.count("non_finite_loss") >= 2 and "out_of_memory" in text

    html = outputs["html"].read_text()
    assert HOSTILE not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script" not in html.lower()
    # No script may run and nothing may be fetched, whatever a string slipped past escaping.
    assert (
        '<meta http-equiv="Content-Security-Policy"\n      content="default-src \'none\'; '
        "img-src data:; style-src 'unsafe-inline'\">" in html
    ) and "http://" not in html and "https://" not in html
    assert html.count("data:image/png;base64,") >= 1  # the curves, embedded
    markdown = outputs["md"].read_text()
    assert HOSTILE not in markdown and "\\<script\\>" in markdown
    assert "&lt;" not in markdown and "&gt;" not in markdown and "&amp;" not in markdown

    blocked = tmp_path / "report.md" / "inside.md"  # a file where a folder would be
    refused = CliRunner().invoke(main, ["--ledger", sqlite_url, "report", "mixed", "--format",
                                        "md", "--output", str(blocked)])
    assert refused.exit_code == 2 and refused.stderr.startswith("campaign: cannot write the ")
    assert len(refused.stderr.splitlines()) == 1 and "Traceback" not in refused.stderr
    stdout = CliRunner().invoke(main, ["--ledger", sqlite_url, "report", "mixed", "--format",
                                       "csv", "--output", "-"])
    assert pd.read_csv(io.StringIO(stdout.stdout))["run_id"].tolist() == tables["csv"][
        "run_id"].tolist()


def test_a_hostile_variant_name_from_the_api_is_text_in_every_format(
    sqlite_ledger: Ledger, tmp_path: Path
) -> None:
    """The planner refuses such names; the Ledger API (notebooks) does not: reports escape."""
    from campaign.report.render import render

    plan_campaign(sqlite_ledger, "hostile", seeds=1, variants={HOSTILE: 1e-4, "other": 2e-4})
    # A run ended through the API records no training time: unknown, not a crash.
    claim = sqlite_ledger.claim_next("hostile", "notebook")
    sqlite_ledger.finish(claim.run_id, "completed", StopRecord("budget_reached", 0, "update"))
    sheet = balance_sheet(sqlite_ledger, "hostile")
    ended = sheet.runs.set_index("run_id").loc[claim.run_id]
    assert pd.isna(ended["training_s"]) and pd.isna(ended["overhead_s"])
    segment = sqlite_ledger.segments("hostile").set_index("run_id").loc[claim.run_id]
    wall = (pd.Timestamp(segment["ended_at"]) - pd.Timestamp(segment["started_at"]))
    assert ended["wall_time_s"] == pytest.approx(wall.total_seconds(), abs=0.01)
    assert set(sheet.runs["variant"]) == {HOSTILE, "other"}
    html = render(sheet, "html")
    assert HOSTILE not in html and html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 2
    assert "<script" not in html.lower()
    # No script may run and nothing may be fetched, whatever a string slipped past escaping.
    assert (
        '<meta http-equiv="Content-Security-Policy"\n      content="default-src \'none\'; '
        "img-src data:; style-src 'unsafe-inline'\">" in html
    )
    assert HOSTILE not in render(sheet, "md")
    # JSON carries the name verbatim, as a string value (json.loads undoes only JSON escaping).
    assert {r["variant"] for r in json.loads(render(sheet, "json"))["runs"]} == {HOSTILE, "other"}


def test_a_campaign_where_no_run_started_archives_and_verifies(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    plan_campaign(sqlite_ledger, "fresh", seeds=1)
    path = tmp_path / "fresh.tar.gz"
    made = CliRunner().invoke(main, ["--ledger", sqlite_url, "archive", "fresh", "--output",
                                     str(path)])
    assert made.exit_code == 0, made.stderr
    checked = CliRunner().invoke(main, ["verify-archive", str(path)])
    assert checked.exit_code == 0 and "every SHA-256 verified" in checked.stderr


def test_a_run_on_another_tokenizer_than_its_variant_is_flagged(ledger: Ledger) -> None:
    """Two seeds of one adapter variant whose ``base_model`` events name other tokenizers (a
    tokenizer folder replaced between the runs): the second is flagged ``base_differs`` with
    both identities; the other variant's runs, alike, are not."""
    from campaign.ledger import NewRun, NewVariant

    ledger.create_campaign(
        "bases", question="q", task="campaign.tasks.digits:build",
        spec={"validation": {"metric": "val/accuracy", "mode": "max"}},
        variants=[NewVariant("a", True, {}), NewVariant("b", False, {"x": 1})],
        runs=[NewRun(v, s, {"budget": {"updates": 1}, "seed": s}) for v in "ab" for s in (0, 1)],
    )
    tokenizers = {("a", 0): "tok (787eec2a)", ("a", 1): "tok (dcb0326a)",
                  ("b", 0): "tok (787eec2a)", ("b", 1): "tok (787eec2a)"}
    ids = ledger.runs("bases").set_index(["variant", "seed"])["run_id"]
    for (variant, seed), tokenizer in tokenizers.items():
        claim = ledger.start(ids[(variant, seed)], "w")
        identity = {"adapter": "lora", "sha256": "f00d", "tokenizer": tokenizer}
        ledger.add_event("bases", "base_model", json.dumps(identity), run_id=claim.run_id)
        with ledger.metric_writer(claim.run_id, claim.segment_id) as writer:
            writer.log("train/loss", 1, 1.0)
            writer.log("val/accuracy", 1, 0.5)
        ledger.finish(claim.run_id, "completed", StopRecord("budget_reached", 1, "update"))
    flags = balance_sheet(ledger, "bases").flags
    found = flags[flags["kind"] == "base_differs"]
    assert found["run_id"].tolist() == [ids[("a", 1)]]
    assert found["detail"].iloc[0] == (f"tokenizer: 'tok (dcb0326a)' here, 'tok (787eec2a)' for "
                                       f"run {ids[('a', 0)]}")
