"""The pilot: every gate fails for a real fault, the digits pilot passes, the sheet adds up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from campaign.cli import main
from campaign.gates.launch_gate import pilot_passed
from campaign.ledger import Ledger
from campaign.loop.task import TaskContract
from campaign.pilot import sizing
from campaign.pilot.phase_gates import PilotRun, PilotSession
from tests.support.loop_helpers import plan_loop

PHASES = [
    "data",
    "forward",
    "backward",
    "update_first",
    "update",
    "validation",
    "checkpoint",
    "resume",
    "export",
    "overfit",
]
FAULTY = "tests.support.tasks.pilot_faults:build"


def _config(ledger: Ledger, **plan: Any) -> dict[str, Any]:
    plan_loop(ledger, **plan)
    return ledger.runs("loop").iloc[0]["config"]


def _verdicts(records: list) -> dict[str, tuple[str, str]]:
    return {r.phase: (r.verdict, r.detail or "") for r in records}


@pytest.fixture
def ledger(sqlite_url: str):
    with Ledger.open(sqlite_url, create=True) as opened:
        yield opened


def _pilot(reference: str, config: dict, tmp_path: Path, **options: Any) -> dict:
    return _verdicts(PilotRun(reference, config, tmp_path / "pilot", **options).run())


def _assert_fails(result: dict, phase: str, cause: str) -> None:
    verdict, detail = result[phase]
    assert verdict == "fail", result
    assert cause in detail, detail
    first = PHASES.index(phase)
    assert all(result[p][0] == "pass" for p in PHASES[:first])
    assert all(result[p][0] == "skipped" for p in PHASES[first + 1 : -1])  # overfit runs anyway


def test_data_fault_fails_the_data_phase(ledger: Ledger, tmp_path: Path) -> None:
    config = _config(ledger, task="tests.support.tasks.broken:digits",
                     config={"task.fault": "group_leak"})
    result = _pilot("tests.support.tasks.broken:digits", config, tmp_path)
    _assert_fails(result, "data", "groups_disjoint: 2 groups are in more than one split")


def test_a_parameter_without_gradient(ledger: Ledger, tmp_path: Path) -> None:
    config = _config(ledger, task=FAULTY, config={"task.fault": "frozen"})
    result = _pilot(FAULTY, config, tmp_path)
    _assert_fails(result, "backward", "trainable parameters got no gradient: blocks.0.0.weight")


def test_an_optimizer_that_updates_nothing(ledger: Ledger, tmp_path: Path) -> None:
    config = _config(ledger)
    config["optimizer"]["lr"] = 0.0  # the spec refuses lr 0: injected past it
    result = _pilot("campaign.tasks.digits:build", config, tmp_path)
    _assert_fails(result, "update_first", "the optimizer step changed nothing")


@pytest.mark.parametrize(
    ("fault", "cause"),
    [
        ("predict_in_train_mode", "the model ran in train mode during validation"),
        ("predict_with_grad", "gradients were enabled during validation"),
    ],
)
def test_validation_mode_faults(ledger: Ledger, tmp_path: Path, fault: str, cause: str) -> None:
    config = _config(ledger, task=FAULTY, config={"task.fault": fault})
    _assert_fails(_pilot(FAULTY, config, tmp_path), "validation", cause)


class ForgetfulSession(PilotSession):
    """A checkpoint writer that forgets the optimizer state."""

    def capture(self) -> tuple[dict, dict]:
        tensors, state = super().capture()
        state["optimizer"] = {
            "__keys__": [
                ["state", {"__keys__": []}],
                ["param_groups", state["optimizer"]["__keys__"][1][1]],
            ]
        }
        return {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}, state


def test_a_checkpoint_that_forgets_the_optimizer_state(ledger: Ledger, tmp_path: Path) -> None:
    config = _config(ledger)
    result = _pilot(
        "campaign.tasks.digits:build", config, tmp_path, session_factory=ForgetfulSession
    )
    _assert_fails(result, "checkpoint", "the checkpoint holds no optimizer state")


def test_state_outside_the_state_dict_fails_the_resume(ledger: Ledger, tmp_path: Path) -> None:
    config = _config(ledger, task=FAULTY, config={"task.fault": "unsaved_state"})
    result = _pilot(FAULTY, config, tmp_path)
    _assert_fails(result, "resume", "the fresh process restored a different state: next_loss")


def test_an_export_that_does_not_reproduce(ledger: Ledger, tmp_path: Path) -> None:
    config = _config(ledger, task=FAULTY, config={"task.fault": "sampled_predictions"})
    result = _pilot(FAULTY, config, tmp_path)
    _assert_fails(result, "export", "does not reproduce the control outputs")


def test_overfit_gate_fails_when_nothing_can_be_learned(ledger: Ledger, tmp_path: Path) -> None:
    config = _config(ledger)
    from campaign.pilot.phase_gates import PilotOptions

    result = _pilot(
        "campaign.tasks.digits:build",
        config,
        tmp_path,
        options=PilotOptions(overfit_steps=2, overfit_factor=1000.0),
    )
    assert result["overfit"][0] == "fail" and "loss fell only" in result["overfit"][1]


def test_a_task_that_prints_does_not_break_the_fresh_process_checks(
    ledger: Ledger, tmp_path: Path
) -> None:
    """The resume and export checks read their answers from their own file, not stdout."""
    config = _config(ledger, task=FAULTY, config={"task.fault": "chatty"})
    result = _pilot(FAULTY, config, tmp_path)
    assert result["resume"][0] == "pass" and result["export"][0] == "pass", result


def test_overfit_gate_refuses_a_single_class_subset(ledger: Ledger, tmp_path: Path) -> None:
    """Eight examples of one class are learned by a constant predictor: proof of nothing."""
    config = _config(ledger, task="tests.support.tasks.broken:digits",
                     config={"task.fault": "one_class"})
    result = _pilot("tests.support.tasks.broken:digits", config, tmp_path)
    assert result["data"][0] == "pass", result["data"]
    verdict, detail = result["overfit"]
    assert verdict == "fail" and "1 distinct target (3)" in detail, detail


def test_digits_pilot_passes_and_is_recorded(
    ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    plan_loop(ledger, seeds=[0, 1], hold={"loop.microbatch": 4})
    result = CliRunner().invoke(
        main,
        ["--ledger", sqlite_url, "pilot", "loop", "--artifacts", str(tmp_path), "--format", "json"],
    )
    assert result.exit_code == 0, (result.stdout, result.stderr)
    document = json.loads(result.stdout)
    (only,) = document["pilots"]  # one gate class: one pilot
    assert document["passed"] and [p["phase"] for p in only["phases"]] == PHASES
    phases = ledger.phases("loop")
    assert list(phases["phase"]) == PHASES and set(phases["verdict"]) == {"pass"}
    assert (phases["rss_peak"] > 10 << 20).all() and phases["allocated_peak"].isna().all()
    assert phases["pilot_id"].notna().all() and phases["duration_s"].gt(0).all()
    assert pilot_passed(ledger, "loop")
    pilots = ledger.pilots("loop")
    assert pilots["config_sha256"].iloc[0] == ledger.campaign("loop").spec_sha256
    assert pilots["environment"].iloc[0]["torch"]

    sheet = json.loads(
        CliRunner()
        .invoke(main, ["--ledger", sqlite_url, "size", "loop", "--format", "json"])
        .stdout
    )
    duration = dict(zip(phases["phase"], phases["duration_s"], strict=True))
    setup = phases.set_index("phase").loc["data", "inputs"]["setup_s"]
    fixed = setup + duration["export"]  # building the task and model; export and replay
    per_run = (12 * duration["update"] + 3 * duration["validation"] + 4 * duration["checkpoint"]
               + fixed)
    (line,) = sheet["classes"]  # one gate class
    assert line["fixed_s"] == round(fixed, 3) and line["seconds_per_run"] == round(per_run, 3)
    assert sheet["seconds_per_run"] == round(per_run, 3)
    assert sheet["total_hours"] == round(2 * per_run * 1.2 / 3600, 4)
    assert sheet["fits_rental_days"] == 3 and "warning" not in sheet
    assert [p["runs_that_fit"] for p in sheet["packages"]] == [2, 2, 2]
    # The update time is a median of repetitions after the first update: recorded as such.
    update = phases.set_index("phase").loc["update", "inputs"]
    low, high = update["range_s"]
    assert update["repetitions"] == 5 and low <= duration["update"] <= high and low < high
    assert max(duration[p] for p in ("forward", "backward", "update")) < 1.0  # no 1 s floor


def test_sizing_arithmetic_by_hand() -> None:
    projection = sizing.project(
        update_s=0.5,
        validation_s=30.0,
        checkpoint_s=4.0,
        runs=9,
        updates=10_000,
        validations=40,
        checkpoints=41,
        reserve=0.25,
    )
    per_run = 10_000 * 0.5 + 40 * 30.0 + 41 * 4.0  # 5,000 + 1,200 + 164 = 6,364 s
    assert projection.seconds_per_run == per_run == 6364.0
    assert projection.compute_seconds == 9 * 6364.0 == 57_276.0
    assert projection.total_seconds == 57_276.0 * 1.25 == 71_595.0  # 19.9 h
    assert projection.fits == 3
    big = sizing.project(
        update_s=0.5,
        validation_s=30.0,
        checkpoint_s=4.0,
        runs=90,
        updates=10_000,
        validations=40,
        checkpoints=41,
        reserve=0.25,
    )
    assert big.total_seconds == 715_950.0 and big.fits == 30  # 8.3 days: not 7, but 30
    huge = sizing.project(
        update_s=5.0,
        validation_s=0,
        checkpoint_s=0,
        runs=100,
        updates=10_000,
        validations=0,
        checkpoints=0,
        reserve=0.0,
    )
    assert huge.fits is None  # 57.9 days: no rental period holds it
    assert sizing.counts(
        {
            "budget": {"updates": 200},
            "validation": {"every": 25},
            "loop": {"checkpoint_every": None},
        }
    ) == {"updates": 200, "validations": 8, "checkpoints": 9}
    assert (
        sizing.counts(
            {
                "budget": {"updates": 210},
                "validation": {"every": 25},
                "loop": {"checkpoint_every": 100},
            }
        )["validations"]
        == 9
    )


def test_size_names_a_different_device(ledger: Ledger, sqlite_url: str, tmp_path: Path) -> None:
    plan_loop(ledger)
    runner = CliRunner()
    assert runner.invoke(main, ["--ledger", sqlite_url, "size", "loop"]).exit_code == 2
    runner.invoke(main, ["--ledger", sqlite_url, "pilot", "loop", "--artifacts", str(tmp_path)])
    result = runner.invoke(main, ["--ledger", sqlite_url, "size", "loop", "--device", "cuda:0"])
    assert result.exit_code == 0
    assert "the pilot ran on cpu, this sheet is for cuda:0" in result.stderr


@pytest.mark.slow
def test_size_says_how_noisy_the_pilots_updates_were(ledger: Ledger, sqlite_url: str,
                                                     tmp_path: Path) -> None:
    """A pilot on a busy machine (some of its updates stall): the sheet gives the timed
    updates' range and spread, and warns that the projection's median came from noise."""
    plan_loop(ledger, task="tests.support.tasks.faulty:build", config={"task.fault": "jitter"})
    runner = CliRunner()
    runner.invoke(main, ["--ledger", sqlite_url, "pilot", "loop", "--artifacts", str(tmp_path)])
    result = runner.invoke(main, ["--ledger", sqlite_url, "size", "loop", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    (line,) = json.loads(result.stdout)["classes"]
    assert line["update_repetitions"] == 5 and line["update_spread"] > 2
    low, high = line["update_range_s"]
    assert low < line["update_s"] <= high
    assert "timed updates took" in result.stderr and "the machine was busy" in result.stderr


def test_doctor_declares_runs_without_heartbeat_lost(ledger: Ledger, sqlite_url: str) -> None:
    import time

    plan_loop(ledger, seeds=[0, 1])
    gone = ledger.claim_next("loop", "gone-worker")
    alive = ledger.claim_next("loop", "alive-worker")
    time.sleep(1.2)
    assert ledger.heartbeat(alive.run_id, lease=alive.lease)
    command = ["--ledger", sqlite_url, "doctor", "--stale-after", "1", "--format", "json"]
    listed = CliRunner().invoke(main, [*command, "--dry-run"])
    assert [r["run_id"] for r in json.loads(listed.stdout)["stale_runs"]] == [gone.run_id]
    assert ledger.run(gone.run_id).status == "running"  # a dry run changes nothing

    result = CliRunner().invoke(main, command)
    document = json.loads(result.stdout)
    assert document["ledger"]["state"] == "up to date" and document["stack"]["torch"]
    assert [r["run_id"] for r in document["stale_runs"]] == [gone.run_id]
    assert "declared lost" in result.stderr
    record = ledger.run(gone.run_id)
    assert (record.status, record.stop_cause) == ("lost", "heartbeat_lost")
    assert "gone-worker" in record.stop_detail
    assert ledger.run(alive.run_id).status == "running"
    events = ledger.events("loop", gone.run_id)
    assert list(events["kind"]) == ["planned", "running", "lost"]
    # The lost worker's lease is dead: whatever it still tries to write is refused.
    assert ledger.heartbeat(gone.run_id, lease=gone.lease) is False


def test_task_protocol_is_satisfied_by_built_in_tasks() -> None:
    from campaign.tasks import arithmetic, digits

    assert isinstance(digits.build({"task": {}}), TaskContract)
    assert isinstance(arithmetic.build({"task": {}, "loop": {}}), TaskContract)


def test_stack_differences_name_what_changed() -> None:
    from campaign.stack.software import stack_differences

    pilot = {"torch": "2.13.0", "cuda": None, "devices": ["cpu"], "python": "3.11.7"}
    same = dict(pilot)
    assert stack_differences(pilot, same) == []
    moved = {**pilot, "torch": "2.14.1", "devices": ["NVIDIA H200"]}
    assert stack_differences(pilot, moved) == [
        "torch: pilot '2.13.0', now '2.14.1'",
        "devices: pilot ['cpu'], now ['NVIDIA H200']",
    ]
    assert stack_differences(None, moved) == ["no stack recorded with the pilot"]


def test_the_overfit_criterion_comes_from_the_spec_and_is_shown(
    ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    """[pilot] sets the overfit gate (a score threshold instead of exact match); the pilot
    table records the criterion with the verdict, and a command-line option still wins. A
    pilot is counted within its campaign (its ledger-wide id beside the count)."""
    import copy

    from campaign.plan.grid import make_plan, record_plan
    from campaign.plan.spec import resolve_spec
    from tests.support.loop_helpers import BASE

    spec = copy.deepcopy(BASE)
    spec["pilot"] = {"overfit_examples": 6, "overfit_metric": "accuracy",
                     "overfit_threshold": 0.5}
    record_plan(ledger, make_plan(resolve_spec(spec, "<criterion>")))
    result = CliRunner().invoke(main, ["--ledger", sqlite_url, "pilot", "loop", "--artifacts",
                                       str(tmp_path), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    (only,) = json.loads(result.stdout)["pilots"]
    overfit = next(p for p in only["phases"] if p["phase"] == "overfit")
    assert "6 examples, 60 steps at lr 0.01: loss falls 5x and accuracy >= 0.5" in overfit["detail"]
    inputs = ledger.phases("loop").set_index("phase").loc["overfit", "inputs"]
    assert inputs["criterion"].startswith("6 examples") and inputs["examples"] == 6
    stricter = CliRunner().invoke(main, ["--ledger", sqlite_url, "pilot", "loop", "--all",
                                         "--artifacts", str(tmp_path), "--overfit-factor", "1e6"])
    assert stricter.exit_code == 1 and "needed 1e+06x" in stricter.stdout
    assert "campaign: pilot 2 (id 2) of 'loop'" in stricter.stderr, stricter.stderr
    spec["campaign"]["name"] = "other"  # the ledger's third pilot is this campaign's first
    record_plan(ledger, make_plan(resolve_spec(spec, "<other>")))
    other = CliRunner().invoke(main, ["--ledger", sqlite_url, "pilot", "other", "--artifacts",
                                      str(tmp_path)])
    assert other.exit_code == 0 and "campaign: pilot 1 (id 3) of 'other'" in other.stderr
    events = ledger.events("other")
    assert events[events["kind"] == "pilot"]["detail"].iloc[-1].startswith("pilot 1 (id 3) on")


LINE = "tests.support.tasks.line:build"


def _line_config(ledger: Ledger, name: str = "loop", **config: Any) -> dict:
    plan_loop(ledger, name, task=LINE, validation={"metric": "val/mse", "mode": "min"},
              config=config)
    return ledger.runs(name).iloc[0]["config"]


def test_a_regression_passes_the_overfit_gate_by_r2(ledger: Ledger, tmp_path: Path) -> None:
    """Exact float match is unfair to a regression: its default criterion is R² >= 0.99."""
    from campaign.pilot.overfit import PilotOptions

    fast = PilotOptions(overfit_lr=0.1)  # a line's weights of 3 and -2 in 60 Adam steps
    verdict, detail = _pilot(LINE, _line_config(ledger), tmp_path, options=fast)["overfit"]
    assert verdict == "pass", detail
    assert "and r2 >= 0.99" in detail
    verdict, detail = _pilot(LINE, _line_config(ledger, "noise", **{"task.learnable": False}),
                             tmp_path / "noise",
                             options=PilotOptions(overfit_lr=0.1, overfit_factor=1))["overfit"]
    assert verdict == "fail" and "needed r2 >= 0.99" in detail


@pytest.mark.parametrize(
    ("threshold", "passes"), [(0.05, True), (0.0, False)],  # 0 stays 0: nothing fits exactly
)
def test_an_error_threshold_is_a_ceiling_and_kept_as_given(
    ledger: Ledger, tmp_path: Path, threshold: float, passes: bool
) -> None:
    from campaign.pilot.overfit import PilotOptions

    options = PilotOptions(overfit_metric="mse", overfit_threshold=threshold, overfit_lr=0.1)
    verdict, detail = _pilot(LINE, _line_config(ledger), tmp_path, options=options)["overfit"]
    assert f"mse <= {threshold:g}" in detail, detail
    assert verdict == ("pass" if passes else "fail"), detail


def test_the_overfit_direction_follows_the_metric() -> None:
    from campaign.pilot.overfit import PilotOptions
    from campaign.plan.metric_names import metric_mode

    assert [metric_mode(m) for m in ("mse", "val/mae", "loss", "token_error", "accuracy",
                                     "r2", "f1")] == ["min"] * 4 + ["max"] * 3
    assert PilotOptions(overfit_metric="accuracy").learned().words() == "accuracy >= 1"
    assert PilotOptions(overfit_metric="r2", overfit_threshold=0).learned().threshold == 0.0
    explicit = PilotOptions(overfit_metric="score", overfit_threshold=2, overfit_mode="min")
    assert explicit.learned().words() == "score <= 2"


def test_a_metric_validation_does_not_produce_fails_the_validation_phase(
    ledger: Ledger, tmp_path: Path
) -> None:
    """What a task that declares no metrics gets (plan cannot tell; here the plan is recorded
    without the command's check): the pilot's validation names the missing metric and the
    ones validation produced, since the runs would end without any value."""
    config = _config(ledger, validation={"metric": "val/acc"})
    result = _pilot("campaign.tasks.digits:build", config, tmp_path)
    verdict, detail = result["validation"]
    assert verdict == "fail"
    assert ("validation.metric: 'val/acc' is not a metric this task produces (did you mean "
            "'val/accuracy'? it produces val/loss, val/accuracy)") in detail
    assert "eval mode" not in detail and "name a metric the task produces" in detail


def test_the_training_sample_estimate_is_piloted_and_timed(ledger: Ledger, tmp_path: Path) -> None:
    """``validation.train_sample`` makes every validation also score a fixed training sample:
    the pilot runs and times it in its validation phase (eval mode, no gradients checked)."""
    config = _config(ledger, validation={"train_sample": 24})
    result = PilotRun("campaign.tasks.digits:build", config, tmp_path / "pilot").run()
    validation = next(r for r in result if r.phase == "validation")
    assert validation.verdict == "pass", validation.detail
    assert "train_eval/loss" in validation.detail and "train_eval/accuracy" in validation.detail
    assert validation.inputs["train_sample"] == 24 and validation.inputs["train_sample_s"] > 0


def test_the_pilot_reads_its_gate_sample_of_the_training_split_once(
    ledger: Ledger, tmp_path: Path
) -> None:
    """The data gate, the longest examples and the overfit check read one sample: 1,000
    generated examples are read once each by the gates (three times before), plus the few
    batches the timed updates draw; the task's splits() makes new objects on every call."""
    from tests.support.tasks import counted

    config = _config(ledger, task="tests.support.tasks.counted:build",
                     config={"task.train_size": 1000})
    counted.READS.clear()
    result = _pilot("tests.support.tasks.counted:build", config, tmp_path)
    assert all(verdict == "pass" for verdict, _ in result.values()), result
    assert set(counted.READS) == set(range(1000))  # every example checked
    assert sum(counted.READS.values()) < 1000 + 200, sum(counted.READS.values())


def test_a_task_whose_splits_draw_is_piloted_on_the_runs_data(ledger: Ledger, tmp_path: Path
                                                              ) -> None:
    """splits() draws from torch's global generator. The pilot asks for the splits once,
    seeded as a run seeds them, and its sessions take the generators on as splits() left
    them: a trainer given those splits builds the initial weights that a trainer that asks
    the task itself builds (a run's), and the pilot passes."""
    import torch

    from campaign.loop.task import build_task
    from campaign.loop.trainer import SeededSplits, Trainer

    reference = "tests.support.tasks.drawn:build"
    config = _config(ledger, task=reference)
    result = _pilot(reference, config, tmp_path)
    assert all(verdict == "pass" for verdict, _ in result.values()), result
    task = build_task(reference, config)
    given = Trainer(task, config, torch.device("cpu"),
                    splits=SeededSplits.of(task, int(config["seed"]) + 1))  # another seed's
    asked = Trainer(task, config, torch.device("cpu"))
    again = Trainer(task, config, torch.device("cpu"),
                    splits=SeededSplits.of(task, int(config["seed"])))
    for trainer in (given, again):
        pairs = zip(trainer.train_set, asked.train_set, strict=True)
        assert all((a["x"] == b["x"]).all() for a, b in pairs)
        weights = zip(trainer.model.parameters(), asked.model.parameters(), strict=True)
        for mine, theirs in weights:
            assert torch.equal(mine, theirs)


def test_the_overfit_check_honours_the_validation_batch(ledger: Ledger, tmp_path: Path) -> None:
    """The recipe for an OOM in validation (``validation.microbatch``) holds in the pilot
    too: its overfit check evaluates in batches of that size, not all its examples at once."""
    config = _config(ledger, task="tests.support.tasks.faulty:build",
                     config={"task.fault": "val_oom", "task.at": 2},
                     validation={"microbatch": 2})
    result = _pilot("tests.support.tasks.faulty:build", config, tmp_path)
    assert "out of memory" not in result["overfit"][1], result["overfit"]
    assert result["validation"][0] == "pass"
