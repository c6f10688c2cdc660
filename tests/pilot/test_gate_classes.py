"""Gates for every configuration (docs/report.md, pilot phases): one pilot per gate class,
and no run starts on a class that no passing pilot has seen.
Real tasks, real pilots, SQLite and PostgreSQL."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from click.testing import CliRunner

from campaign.cli import main
from campaign.gates.classes import gate_class
from campaign.ledger import Ledger
from campaign.plan.grid import make_plan, record_plan
from campaign.plan.spec import resolve_spec
from tests.support.loop_helpers import BASE


def _cli(url: str, *args: str) -> object:
    return CliRunner().invoke(main, ["--ledger", url, *args])


def test_two_memory_classes_each_need_their_pilot(ledger: Ledger, ledger_url: str,
                                                  tmp_path: Path) -> None:
    spec = copy.deepcopy(BASE)
    spec["campaign"]["name"] = "widths"
    spec["grid"] = {"seeds": [0, 1], "control": "narrow", "variants": [
        {"name": "narrow"}, {"name": "narrow-lr", "set": {"optimizer.lr": 2e-2}},
        {"name": "wide", "set": {"task.hidden": 256}}]}
    record_plan(ledger, make_plan(resolve_spec(spec, "<widths>")))
    runs = ledger.runs("widths")
    classes = {v: gate_class(c).id for v, c in zip(runs["variant"], runs["config"], strict=True)}
    assert classes["narrow"] == classes["narrow-lr"] != classes["wide"]  # lr is free; width not
    artifacts = str(tmp_path / "a")

    narrow = _cli(ledger_url, "pilot", "widths", "--class", classes["narrow"][:6],
                  "--artifacts", artifacts, "--format", "json")
    assert narrow.exit_code == 0, narrow.stderr
    refused = _cli(ledger_url, "launch", "widths", "--artifacts", artifacts)
    assert refused.exit_code == 1, refused.stderr
    assert f"gate class {classes['wide']}" in refused.stderr
    assert "task.hidden=256" in refused.stderr and "campaign pilot widths" in refused.stderr
    assert classes["narrow"] not in refused.stderr.split("have no passing pilot")[1]
    assert set(ledger.runs("widths")["status"]) == {"planned"}  # refused before any run

    rest = _cli(ledger_url, "pilot", "widths", "--artifacts", artifacts, "--format", "json")
    assert rest.exit_code == 0, rest.stderr
    (wide,) = json.loads(rest.stdout)["pilots"]  # only the class not yet covered
    assert wide["gate_class"] == classes["wide"] and wide["variant"] == "wide"
    pilots = ledger.pilots("widths")
    assert sorted(pilots["gate_class"]) == sorted({classes["narrow"], classes["wide"]})
    assert set(pilots["verdict"]) == {"pass"}
    again = _cli(ledger_url, "pilot", "widths", "--artifacts", artifacts)
    assert again.exit_code == 0 and "every gate class" in again.stderr
    assert len(ledger.pilots("widths")) == 2  # nothing left to pilot

    # The sizing sheet projects each class from its own pilot, in priority order.
    sized = _cli(ledger_url, "size", "widths", "--format", "json", "--gpu-memory", "80GiB")
    assert sized.exit_code == 0, sized.stderr
    sheet = json.loads(sized.stdout)
    by_class = {line["gate_class"]: line for line in sheet["classes"]}
    pilot_of = dict(zip(pilots["gate_class"], pilots["pilot_id"], strict=True))
    assert {c: line["pilot_id"] for c, line in by_class.items()} == pilot_of
    assert by_class[classes["wide"]]["runs"] == 2 and by_class[classes["narrow"]]["runs"] == 4
    assert by_class[classes["wide"]]["memory_note"].startswith("no CUDA measurement")
    assert sheet["runs"] == 6 and sheet["packages"][0]["runs_that_fit"] == 6
    lots = _cli(ledger_url, "size", "widths", "--gpu-memory", "lots")
    assert lots.exit_code == 2 and lots.stderr.startswith("campaign: --gpu-memory: 'lots' is not")
    # The report shows each class's own pilot, the overfit criterion with the verdict.
    from campaign.report.balance import balance_sheet

    table = balance_sheet(ledger, "widths").phases
    assert set(table["gate_class"]) == {classes["narrow"], classes["wide"]}
    overfit = table[table["phase"] == "overfit"]["detail"]
    assert len(overfit) == 2 and overfit.str.contains("every prediction exact").all()


def test_a_relaunch_that_cuts_targets_is_refused_until_truncation_is_allowed(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    spec = copy.deepcopy(BASE)
    spec["campaign"].update(name="cut", task="campaign.tasks.arithmetic:build")
    spec["config"] = {"optimizer.name": "adamw", "optimizer.lr": 3e-3, "task.train_size": 200,
                      "task.val_size": 20}
    record, _ = record_plan(sqlite_ledger, make_plan(resolve_spec(spec, "<cut>")))
    original = record.run_ids[0]
    artifacts = str(tmp_path / "a")
    assert _cli(sqlite_url, "pilot", "cut", "--artifacts", artifacts).exit_code == 0
    short = json.loads(_cli(sqlite_url, "relaunch", original, "--set", "loop.max_length=7",
                            "--reason", "shorter sequences", "--format", "json").stdout)["run_id"]
    refused = _cli(sqlite_url, "run", short, "--artifacts", artifacts)
    assert refused.exit_code == 1 and "has no passing pilot" in refused.stderr
    failed = _cli(sqlite_url, "pilot", "cut", "--artifacts", artifacts)
    assert failed.exit_code == 1 and "max_length cuts the target" in failed.stdout
    still = _cli(sqlite_url, "run", short, "--artifacts", artifacts)
    assert still.exit_code == 1 and sqlite_ledger.run(short).status == "planned"

    sqlite_ledger.withdraw(short, "cuts targets")
    allowed = json.loads(_cli(sqlite_url, "relaunch", original, "--set", "loop.max_length=7",
                              "--set", "loop.allow_target_truncation=true", "--reason",
                              "shorter, cut on purpose", "--format", "json").stdout)["run_id"]
    assert _cli(sqlite_url, "pilot", "cut", "--artifacts", artifacts).exit_code == 0
    ran = _cli(sqlite_url, "run", allowed, "--artifacts", artifacts)
    assert ran.exit_code == 0, ran.stderr
    assert sqlite_ledger.run(allowed).status == "completed"


def test_a_run_planned_while_workers_run_is_gated_before_a_claim(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    from campaign.errors import GateClosed
    from campaign.launch.worker import _refuse_ungated_newcomers

    spec = copy.deepcopy(BASE)
    spec["campaign"]["name"] = "late"
    record, _ = record_plan(sqlite_ledger, make_plan(resolve_spec(spec, "<late>")))
    assert _cli(sqlite_url, "pilot", "late", "--artifacts", str(tmp_path)).exit_code == 0
    gated: set[str] = set()
    _refuse_ungated_newcomers(sqlite_ledger, "late", gated)  # the launch's look
    assert gated == set(record.run_ids)
    wide = _cli(sqlite_url, "relaunch", record.run_ids[0], "--set", "task.hidden=512",
                "--reason", "a wider model, planned mid-launch")
    assert wide.exit_code == 0, wide.stderr
    try:
        _refuse_ungated_newcomers(sqlite_ledger, "late", gated)
    except GateClosed as closed:
        assert "no passing pilot" in str(closed)
    else:
        raise AssertionError("a run of an unpiloted class was about to be claimed")
