"""The data gate and `campaign inspect`: each fault in a real task is caught and named."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from campaign.cli import main
from campaign.ledger import Ledger
from campaign.loop.task import build_task
from campaign.pilot.data_gate import check_data, passed
from tests.support.loop_helpers import plan_loop

DIGITS = {"task": {"limit": 400}}
ARITHMETIC = {"task": {"train_size": 200, "val_size": 40}, "loop": {}}


def _failures(reference: str, config: dict) -> dict[str, str]:
    findings = check_data(build_task(reference, config), config)
    return {f.check: f"{f.detail} | {f.advice}" for f in findings if not f.ok}


@pytest.mark.parametrize(
    "reference", ["campaign.tasks.digits:build", "campaign.tasks.arithmetic:build"]
)
def test_built_in_tasks_pass(reference: str) -> None:
    config = DIGITS if "digits" in reference else ARITHMETIC
    task = build_task(reference, config)
    assert passed(check_data(task, config))


@pytest.mark.parametrize(
    ("fault", "check", "named"),
    [
        ("duplicate_ids", "ids_unique", "appear more than once"),
        ("label_out_of_range", "labels_in_range", "labels outside 0..9"),
        ("swapped_classes", "class_mapping", "label 0 -> class '1' but the data says '0'"),
        ("group_leak", "groups_disjoint", "2 groups are in more than one split"),
    ],
)
def test_digits_faults(fault: str, check: str, named: str) -> None:
    failures = _failures("tests.support.tasks.broken:digits",
                         {"task": {"limit": 400, "fault": fault}})
    assert list(failures) == [check], failures
    assert named in failures[check]


@pytest.mark.parametrize(
    ("fault", "seen"),
    [("collate_shift", [f"'{k}' -> '{(k + 1) % 10}'" for k in range(10)]),
     ("collate_constant", [f"'{k}' -> '0'" for k in range(1, 10)])],
)
def test_labels_are_checked_where_the_loss_sees_them(fault: str, seen: list[str]) -> None:
    """The examples are right and collate() corrupts the targets: caught at the loss, in
    both splits, with the examples' ids named."""
    task = build_task("tests.support.tasks.broken:digits", {"task": {"limit": 400, "fault": fault}})
    findings = {f.check: f for f in check_data(task, {"task": {"limit": 400}}) if not f.ok}
    assert set(findings) >= {"labels_at_loss[train]", "labels_at_loss[val]"}, findings
    train = findings["labels_at_loss[train]"].detail
    first = task.splits()["train"][0]["id"]
    shown = [pair for pair in seen if pair in train]  # each shown pair is the fault's own
    assert len(shown) == 4 and f"first ids: {first!r}, " in train, train
    labels = [e["label"] for e in task.splits()["train"]]
    wrong = len(labels) - (labels.count(0) if fault == "collate_constant" else 0)  # 0 stays 0
    assert train.startswith(f"{wrong} of 320 targets at the loss differ"), train
    assert "fix collate()" in findings["labels_at_loss[train]"].advice


def test_a_swapped_class_table_names_the_ids() -> None:
    task = build_task("tests.support.tasks.broken:digits",
                      {"task": {"limit": 400, "fault": "swapped_classes"}})
    (finding,) = [f for f in check_data(task, {"task": {}}) if not f.ok]
    swapped = [e["id"] for e in task.splits()["train"] if e["label"] in (0, 1)]
    assert finding.check == "class_mapping" and repr(swapped[0]) in finding.detail


def test_predict_records_without_a_target_name_the_function_and_key() -> None:
    from campaign.errors import TaskContractError
    from campaign.loop.task import check_records

    with pytest.raises(TaskContractError, match=r"predict\(\) record 1 has no 'target'"):
        check_records([{"id": 1, "prediction": 2, "target": 2}, {"id": 2, "prediction": 3}])


def test_examples_without_group_are_a_warning_naming_the_key() -> None:
    from campaign.pilot.leakage import Finding, groups_disjoint

    finding: Finding = groups_disjoint({"train": [{"id": 1}], "val": [{"id": 2}]})
    assert finding.ok and finding.warning and "'group'" in finding.detail


def test_prompt_tokens_in_the_loss_are_caught() -> None:
    config = {"task": {**ARITHMETIC["task"], "fault": "prompt_in_loss"}, "loop": {}}
    failures = _failures("tests.support.tasks.broken:arithmetic", config)
    # Unmasked prompt tokens also change the target the loss trains on: both are named.
    assert set(failures) == {"prompt_out_of_loss", "labels_at_loss[train]", "labels_at_loss[val]"}
    assert "put prompt tokens into the loss" in failures["prompt_out_of_loss"]


def test_max_length_that_cuts_targets_fails_unless_allowed() -> None:
    config = {"task": ARITHMETIC["task"], "loop": {"max_length": 7}}
    failures = _failures("campaign.tasks.arithmetic:build", config)
    assert list(failures) == ["truncation"]
    assert "max_length cuts the target of" in failures["truncation"]
    assert "allow_target_truncation" in failures["truncation"]
    allowed = {**config, "loop": {"max_length": 7, "allow_target_truncation": True}}
    assert _failures("campaign.tasks.arithmetic:build", allowed) == {}


def test_inspect_command(sqlite_url: str) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        plan_loop(
            ledger,
            task="campaign.tasks.arithmetic:build",
            config={"task.train_size": 100, "task.val_size": 20},
        )
    result = CliRunner().invoke(
        main, ["--ledger", sqlite_url, "inspect", "loop", "--n", "2", "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert len(document["examples"]) == 2 and document["passed"]
    first = document["examples"][0]
    assert set(first) >= {"id", "input", "target", "mask", "length", "truncated"}
    summary = document["summary"]
    assert summary["examples"] == 100 and summary["length_min"] <= summary["length_max"]
    if summary["length_min"] < summary["length_max"]:  # padding is what the lengths leave
        assert 0 < summary["padding_fraction"] < 1
    else:
        assert summary["padding_fraction"] == 0


def test_inspect_exits_1_when_the_gate_fails(sqlite_url: str) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        plan_loop(ledger, task="tests.support.tasks.broken:digits",
                  config={"task.fault": "group_leak"})
    result = CliRunner().invoke(main, ["--ledger", sqlite_url, "inspect", "loop"])
    assert result.exit_code == 1
    assert "groups_disjoint" in result.stdout and "FAIL" in result.stdout
    assert "data gate failed (groups_disjoint)" in result.stderr
    assert "target: label " in result.stdout  # the examples are shown as the loss sees them


def test_digits_read_without_scikit_learn_equal_load_digits() -> None:
    from sklearn.datasets import load_digits

    from campaign.tasks.digits import TARGET_NAMES, load_digits_file

    pixels, targets = load_digits_file()
    reference = load_digits()
    assert np.array_equal(pixels, reference.data) and np.array_equal(targets, reference.target)
    assert np.array_equal(TARGET_NAMES, reference.target_names)


def test_inspect_shows_the_collated_batch_the_gate_reads(sqlite_url: str) -> None:
    """A collate that puts the prompt into the loss while describe() masks it: inspect's view
    of the collated row marks the prompt's positions as in the loss, as the gate finds."""
    with Ledger.open(sqlite_url, create=True) as ledger:
        plan_loop(ledger, task="tests.support.tasks.broken:arithmetic",
                  config={"task.train_size": 100, "task.val_size": 20,
                          "task.fault": "collate_prompt_in_loss"})
    result = CliRunner().invoke(
        main, ["--ledger", sqlite_url, "inspect", "loop", "--n", "2", "--format", "json"]
    )
    assert result.exit_code == 1, result.stderr  # prompt_out_of_loss
    document = json.loads(result.stdout)
    described, collated = document["examples"][0], document["loss_view"][0]
    assert described["id"] == collated["id"]
    assert described["mask"].startswith(".")  # describe() says the prompt is masked
    assert collated["targets in loss"].startswith("L")  # what the loss really gets
    assert "+" in collated["targets in loss, decoded"]  # the prompt's '+' is learned
    assert collated["tokens decoded"].startswith("'^")
    gate = {g["check"]: g["verdict"] for g in document["data_gate"]}
    assert gate["prompt_out_of_loss"] == "FAIL"
    text = CliRunner().invoke(main, ["--ledger", sqlite_url, "inspect", "loop", "--n", "1"])
    assert "as the loss receives it (collate):" in text.stdout
    assert "  targets in loss: L" in text.stdout


def test_an_example_may_name_several_leakage_units() -> None:
    """A sliding window touches two weeks: naming only its input week let a window that
    straddles the split pass; with ``groups`` it is refused."""
    from campaign.pilot.leakage import groups_disjoint

    def window(week: int) -> dict:
        return {"id": f"w{week}", "group": f"week-{week}",
                "groups": [f"week-{week}", f"week-{week + 1}"]}

    straddling = {"train": [window(7), window(8)], "val": [window(9)]}
    finding = groups_disjoint(straddling)
    assert not finding.ok and "'week-9' (train+val)" in finding.detail
    clean = {"train": [window(7)], "val": [window(9)]}  # week 8 is a gap between the splits
    assert groups_disjoint(clean).ok
    only_group = {"train": [{"id": "a", "group": "week-8"}],
                  "val": [{"id": "b", "group": "week-9"}]}
    assert groups_disjoint(only_group).ok  # one unit each: what the gate saw before


def test_a_regression_target_scaled_in_collate_fails_whatever_its_key() -> None:
    """The line task's target is ``y``, not ``target``: still compared at the loss."""
    config = {"loop": {}, "task": {"collate_scale": 10.0}}
    failures = _failures("tests.support.tasks.line:build", config)
    assert "labels_at_loss[train]" in failures and "differ from the examples'" in failures[
        "labels_at_loss[train]"]
    assert _failures("tests.support.tasks.line:build", {"loop": {}, "task": {}}) == {}


@pytest.mark.parametrize("fault", ["no_prompt_lengths", "prompt_in_loss_unbounded"])
def test_a_generative_batch_without_a_prompt_boundary_fails_the_gate(fault: str) -> None:
    """Examples with a 'prompt' whose batches give no 'prompt_lengths': the prompt may be in
    the loss (it is, in the second) and nothing could tell; a gate failure, not a pass."""
    config = {"task": {**ARITHMETIC["task"], "fault": fault}, "loop": {}}
    failures = _failures("tests.support.tasks.broken:arithmetic", config)
    assert "prompt_out_of_loss" in failures
    assert "without 'prompt_lengths'" in failures["prompt_out_of_loss"]
