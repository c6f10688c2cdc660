"""Planning: the arithmetic of §6, the §10 spec, grids, relaunch lineage (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from campaign.cli import main
from campaign.ledger import Ledger
from campaign.plan.grid import account, make_plan
from campaign.plan.spec import SpecError, load_spec
from tests.support.raw import execute

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "tests" / "support" / "specs" / "digits-lr.toml"


def cli(url: str, *args: str):
    return CliRunner().invoke(main, ["--ledger", url, *args])


def test_practice_example_and_its_reverse() -> None:
    seen_once = account(2, 8, 1, epochs=1, train_examples=3200)
    assert (seen_once.examples_per_update, seen_once.updates) == (16, 200)
    assert seen_once.examples_seen == 3200 and seen_once.epochs == 1.0
    fixed_updates = account(2, 8, 1, updates=200)
    assert (fixed_updates.examples_per_update, fixed_updates.examples_seen) == (16, 3200)
    four_replicas = account(2, 8, 4, updates=200)
    assert (four_replicas.examples_per_update, four_replicas.examples_seen) == (64, 12_800)


def test_last_batch_policy_and_fractional_epochs() -> None:
    partial = account(2, 8, 1, epochs=2, train_examples=3210)  # 10 examples in a last update
    assert (partial.updates_per_epoch, partial.updates, partial.examples_seen) == (201, 402, 6420)
    dropped = account(2, 8, 1, epochs=2, train_examples=3210, last_batch="drop")
    assert (dropped.updates_per_epoch, dropped.updates, dropped.examples_seen) == (200, 400, 6400)
    half = account(2, 8, 1, epochs=0.5, train_examples=3200)
    assert (half.updates, half.examples_seen, half.epochs) == (100, 1600, 0.5)
    by_updates = account(2, 8, 1, updates=300, train_examples=3200)
    assert by_updates.epochs == 1.5
    with pytest.raises(ValueError, match="training examples"):
        account(2, 8, 1, epochs=1)


def test_three_learning_rates_plan_nine_runs(ledger_url: str) -> None:
    result = cli(ledger_url, "plan", str(SPEC), "--format", "json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    ids = [r["run_id"] for r in document["runs"]]
    assert len(ids) == 9 == len(set(ids)) and all(ids)
    assert document["control"] == "lr-1e-4"
    assert [v["variant"] for v in document["variants"]] == ["lr-1e-4", "lr-5e-5", "lr-2e-4"]
    with Ledger.open(ledger_url, create=True) as ledger:
        runs = ledger.runs("digits-lr")
    assert set(runs["run_id"]) == set(ids)
    assert runs["is_control"].sum() == 3
    held = {(c["loop"]["microbatch"], c["loop"]["accumulation"], c["loop"]["replicas"],
             c["loop"]["precision"], c["budget"]["updates"]) for c in runs["config"]}
    assert held == {(2, 8, 1, "fp32", 200)}
    assert sorted({c["optimizer"]["lr"] for c in runs["config"]}) == [5e-5, 1e-4, 2e-4]
    assert {c["budget"]["examples_seen"] for c in runs["config"]} == {3200}


def test_plan_hash_is_stable_across_processes() -> None:
    here = load_spec(SPEC)
    code = (
        "from campaign.plan.spec import load_spec; from campaign.plan.grid import make_plan; "
        f"s = load_spec({str(SPEC)!r}); "
        "print(s.sha256, *[r.config_sha256 for r in make_plan(s).runs])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, cwd=ROOT, check=True)
    mine = " ".join([here.sha256, *[r.config_sha256 for r in make_plan(here).runs]])
    assert other.stdout.strip() == mine


def test_same_name_identical_spec_is_a_noop_different_spec_refused(
    ledger_url: str, tmp_path: Path
) -> None:
    assert cli(ledger_url, "plan", str(SPEC)).exit_code == 0
    again = cli(ledger_url, "plan", str(SPEC))
    assert again.exit_code == 0 and "identical spec; nothing written" in again.stderr
    changed = tmp_path / "changed.toml"
    changed.write_text(SPEC.read_text().replace("seeds = [0, 1, 2]", "seeds = [0, 1]"))
    refused = cli(ledger_url, "plan", str(changed))
    assert refused.exit_code == 2
    assert "already planned with a different spec" in refused.stderr
    assert execute(ledger_url, "SELECT COUNT(*) FROM runs") == [(9,)]


def test_axis_names_are_formatted_one_way_and_the_control_hint_lists_them(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "axes.toml"
    head = SPEC.read_text().split("[grid]")[0]
    axes = '[grid.axes]\n"optimizer.lr" = [1e-3, 3e-4, 3e-3, 50.0, 2.5e-4]\n'
    spec.write_text(head + '[grid]\nseeds = [0]\ncontrol = "lr-1e-3"\n' + axes)
    names = [v.name for v in load_spec(spec).variants]
    assert names == ["lr-1e-3", "lr-3e-4", "lr-3e-3", "lr-5e1", "lr-2.5e-4"]
    spec.write_text(head + '[grid]\nseeds = [0]\ncontrol = "lr-0.001"\n' + axes)
    with pytest.raises(SpecError) as refused:
        load_spec(spec)
    assert "grid.control: 'lr-0.001' is not a variant" in str(refused.value)
    assert "variants: lr-1e-3, lr-3e-4, lr-3e-3, lr-5e1, lr-2.5e-4" in str(refused.value)
    words = '[grid.axes]\n"task.note" = ["a b"]\n'
    spec.write_text(head + '[grid]\nseeds = [0]\ncontrol = "note-a b"\n' + words)
    with pytest.raises(SpecError, match=r"grid\.axes: the variant name 'note-a b'"):
        load_spec(spec)


def test_axes_expand_to_the_product(tmp_path: Path) -> None:
    spec = tmp_path / "axes.toml"
    text = SPEC.read_text().split("[grid]")[0] + (
        '[grid]\nseeds = [0]\ncontrol = "lr-1e-4_weight_decay-1e-2"\n'
        '[grid.axes]\n"optimizer.lr" = [1e-4, 5e-5, 2e-4]\n"optimizer.weight_decay" = [0.01, 0.1]\n'
    )
    spec.write_text(text.replace('"optimizer.weight_decay" = 0.01\n', ""))
    resolved = load_spec(spec)
    names = [v.name for v in resolved.variants]
    assert len(names) == 6 and "lr-5e-5_weight_decay-1e-1" in names
    assert resolved.control.config["optimizer"] == {**resolved.control.config["optimizer"],
                                                   "lr": 1e-4, "weight_decay": 0.01}


def test_epoch_budget_counts_the_task_and_warns_on_unequal_data(tmp_path: Path) -> None:
    spec = tmp_path / "epochs.toml"
    text = (
        SPEC.read_text()
        .replace('"budget.updates" = 200\n', "")
        .replace("[config]\n", '[config]\n"budget.epochs" = 1\n"task.train_size" = 3200\n')
    )
    text = text.replace('set = { "optimizer.lr" = 2e-4 }', 'set = { "task.train_size" = 1600 }')
    spec.write_text(text)
    plan = make_plan(load_spec(spec))
    assert plan.accounting["lr-1e-4"].updates == 200
    assert plan.accounting["lr-2e-4"].updates == 100
    assert plan.warnings and "different numbers of examples" in plan.warnings[0]


def test_relaunch_keeps_the_old_run_byte_identical(ledger_url: str) -> None:
    planned = json.loads(cli(ledger_url, "plan", str(SPEC), "--format", "json").stdout)
    old = planned["runs"][0]["run_id"]
    before = execute(ledger_url, "SELECT * FROM runs WHERE id = ?", (old,))
    result = cli(ledger_url, "relaunch", old, "--set", "loop.microbatch=1",
                 "--set", "loop.accumulation=16", "--reason", "OOM in validation",
                 "--format", "json")
    assert result.exit_code == 0, result.stderr
    new = json.loads(result.stdout)
    assert new["run_id"] != old and new["relaunch_of"] == old
    assert new["deviation"] == ["loop.accumulation", "loop.microbatch"]
    # What really changed against the old run (same effective batch: 16 examples per update).
    assert new["changes"] == {"loop.accumulation": [8, 16], "loop.microbatch": [2, 1]}
    assert "deviation" in result.stderr
    assert execute(ledger_url, "SELECT * FROM runs WHERE id = ?", (old,)) == before
    listed = json.loads(cli(ledger_url, "runs", "digits-lr", "--format", "json").stdout)
    by_id = {r["run_id"]: r for r in listed}
    assert old in by_id and by_id[new["run_id"]]["relaunch_of"] == old
    assert by_id[new["run_id"]]["deviation"] == "loop.accumulation, loop.microbatch"
    with Ledger.open(ledger_url, create=True) as ledger:
        config = ledger.run(new["run_id"]).config_document
    assert config["budget"]["examples_per_update"] == 16  # same effective batch
    same_batch = cli(ledger_url, "relaunch", old, "--set", "optimizer.lr=3e-4", "--reason", "x",
                     "--format", "json")
    assert json.loads(same_batch.stdout)["deviation"] == []
    # optimizer.lr tells the variants apart: said at once, not only in the report
    assert "which tells the variants apart" in same_batch.stderr
    rerun = cli(ledger_url, "relaunch", old, "--set", "optimizer.lr=1e-4", "--reason", "x")
    assert "none (an identical config: a rerun)" in rerun.stdout
    assert "tells the variants apart" not in rerun.stderr


def test_notes_and_status_filter(ledger_url: str) -> None:
    cli(ledger_url, "plan", str(SPEC))
    assert cli(ledger_url, "note", "digits-lr", "control kept").exit_code == 0
    notes = json.loads(cli(ledger_url, "notes", "digits-lr", "--format", "json").stdout)
    assert [n["text"] for n in notes] == ["control kept"]
    planned = cli(ledger_url, "runs", "digits-lr", "--status", "planned", "--format", "csv")
    assert len(planned.stdout.strip().splitlines()) == 10
    running = cli(ledger_url, "runs", "digits-lr", "--status", "running", "--format", "json")
    assert json.loads(running.stdout) == []
    none = cli(ledger_url, "runs", "digits-lr", "--status", "withdrawn", "--format", "csv")
    assert none.stdout.strip().startswith("run_id,variant,seed,status")  # a header, no row
    shown = json.loads(cli(ledger_url, "show", "digits-lr", "--format", "json").stdout)
    assert shown["runs"] == 9 and shown["notes"] == 1
    assert [v["planned"] for v in shown["variants"]] == [3, 3, 3]
    assert [v["control"] for v in shown["variants"]] == [True, False, False]
    assert shown["hold"]["loop.microbatch"] == 2 and shown["variants"][0]["relaunches"] == 0


def test_dry_run_writes_nothing(sqlite_url: str) -> None:
    result = cli(sqlite_url, "plan", str(SPEC), "--dry-run")
    assert result.exit_code == 0 and "nothing written" in result.stderr
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()


def test_plan_through_the_installed_console_script(tmp_path: Path) -> None:
    script = shutil.which("campaign")
    assert script
    env = {**os.environ, "CAMPAIGN_LEDGER": f"sqlite:///{tmp_path / 'l.db'}"}
    done = subprocess.run([script, "plan", str(SPEC), "--format", "json"], capture_output=True,
                          text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["runs"]) == 9
    bad = subprocess.run([script, "plan", str(tmp_path / "missing.toml")], capture_output=True,
                         text=True, env=env, cwd=ROOT)
    assert bad.returncode == 2 and "no such spec file" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_load_spec_error_type() -> None:
    with pytest.raises(SpecError, match="no such spec file"):
        load_spec("/nonexistent/spec.toml")


def test_the_example_spec_plans_on_the_built_in_task() -> None:
    plan = make_plan(load_spec(ROOT / "examples" / "digits-lr.toml"))
    assert len(plan.runs) == 9 and plan.spec.task == "campaign.tasks.digits:build"
    accounting = plan.accounting["lr-1e-4"]
    # 1,437 training digits: 89 full updates of 16 and a partial one of 13 per epoch, so
    # 200 updates are two epochs (2,874 examples) and 20 updates more (320): 3,194.
    assert (accounting.updates_per_epoch, accounting.examples_seen) == (90, 3194)
    assert accounting.epochs == 3194 / 1437


def test_a_stated_training_set_size_must_match_the_task() -> None:
    """A spec that says 3,200 training examples for a 240-example split is refused (exit 2 on
    the command line), not planned with wrong epochs."""
    import copy

    from campaign.plan.grid import make_plan
    from campaign.plan.spec import resolve_spec
    from tests.support.loop_helpers import BASE

    spec = copy.deepcopy(BASE)
    spec["hold"]["budget.train_examples"] = 3200
    with pytest.raises(SpecError, match=r"budget\.train_examples = 3200, but the task's train "
                                        r"split has 240 examples"):
        make_plan(resolve_spec(spec, "<size>"))
    spec["hold"]["budget.train_examples"] = 240
    assert make_plan(resolve_spec(spec, "<size>")).runs


def test_plan_checks_the_task_contract_before_writing(tmp_path: Path) -> None:
    spec = tmp_path / "partial.toml"
    text = SPEC.read_text()
    spec.write_text(text.replace("tests.support.tasks.tiny:build",
                                 "tests.support.tasks.tiny:build_partial"))
    url = f"sqlite:///{tmp_path / 'l.db'}"
    refused = cli(url, "plan", str(spec))
    assert refused.exit_code == 2 and "Traceback" not in refused.stderr
    assert "campaign.task: task tests.support.tasks.tiny:build_partial: missing model, collate" in (
        refused.stderr)
    assert not (tmp_path / "l.db").exists()


def test_sampling_with_replacement_counts_draws_not_epochs(sqlite_url: str,
                                                           tmp_path: Path) -> None:
    """A run that draws each update at random does no epochs: its accounting records the
    draws (every update a full one, no partial last batch of an epoch), and an epoch budget
    for it is refused in one line."""
    drawn = account(8, 1, updates=50, train_examples=96, sampling="with_replacement")
    assert (drawn.examples_seen, drawn.epochs, drawn.updates_per_epoch) == (400, None, None)
    assert drawn.draws_per_example == 400 / 96
    epochs = account(8, 1, updates=50, train_examples=96)  # 12 an epoch: 4 epochs and 2
    assert epochs.examples_seen == 4 * 96 + 16 and epochs.epochs == 400 / 96
    spec = tmp_path / "drawn.toml"
    spec.write_text(SPEC.read_text().replace(
        '"budget.updates" = 200', '"budget.epochs" = 2\n"loop.sampling" = "with_replacement"'))
    refused = cli(sqlite_url, "plan", str(spec), "--dry-run")
    assert refused.exit_code == 2
    assert "a run has no epochs to count; set budget.updates" in refused.stderr
    assert 'hold."loop.sampling":' in refused.stderr  # where the rule's first key was set
    assert len(refused.stderr.strip().splitlines()) == 1
