"""At least 25 bad specs: each refused with one line naming the file and the key path,
exit code 2, and the ledger unchanged (docs/spec.md, docs/cli.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from campaign.cli import main
from tests.support.raw import execute

SPEC = Path(__file__).parents[1] / "support" / "specs" / "digits-lr.toml"
TABLES = ("campaigns", "variants", "runs", "events", "notes")

# (case id, [(text to replace, replacement)], fragment expected in the one error line)
BAD_SPECS = [
    ("name-missing", [('name = "digits-lr"\n', "")], "campaign.name: required key is missing"),
    ("name-spaces", [('name = "digits-lr"', 'name = "digits lr"')], "campaign.name: expected"),
    ("task-no-colon", [('"tests.support.tasks.tiny:build"', '"tests.support.tasks.tiny"')], "campaign.task"),
    ("task-not-importable", [("tests.support.tasks.tiny:build", "no_such_pkg.tasks:build")],
     "campaign.task: cannot import 'no_such_pkg.tasks'"),
    ("task-not-callable", [("tiny:build", "tiny:NOT_CALLABLE")],
     "campaign.task: module 'tests.support.tasks.tiny' has no callable 'NOT_CALLABLE'"),
    ("unknown-section", [("[hold]", "[hodl]")], "hodl: unknown key"),
    ("unknown-campaign-key", [("question =", "quesiton =")],
     "campaign.quesiton: unknown key (did you mean 'question'?)"),
    ("question-blank", [('"Which learning rate gives the best validation accuracy after 200 updates?"', '"  \t "')],
     "campaign.question: expected the question the campaign answers, not only spaces"),
    ("microbatch-zero", [('"loop.microbatch" = 2', '"loop.microbatch" = 0')],
     'hold."loop.microbatch": expected greater than or equal to 1, got 0'),
    ("microbatch-string", [('"loop.microbatch" = 2', '"loop.microbatch" = "2"')],
     'hold."loop.microbatch": expected a valid integer'),
    ("precision-unknown", [('"loop.precision" = "fp32"', '"loop.precision" = "fp8"')],
     'hold."loop.precision": expected \'fp32\', \'bf16\' or \'fp16\''),
    ("replicas-float", [('"loop.replicas" = 1', '"loop.replicas" = 1.5')],
     'hold."loop.replicas": expected a valid integer'),
    ("strategy-unknown", [('"loop.replicas" = 1', '"loop.replicas" = 1\n"loop.strategy" = "fdsp"')],
     'hold."loop.strategy": expected \'replicate\' or \'fsdp\', got \'fdsp\''),
    ("config-key-typo", [('"optimizer.weight_decay"', '"optimizer.weight_decy"')],
     "config.\"optimizer.weight_decy\": unknown key (did you mean 'weight_decay'?)"),
    ("unknown-namespace", [("[config]\n", '[config]\n"model.depth" = 4\n')],
     'config."model.depth": unknown key'),
    ("two-budgets", [("[config]\n", '[config]\n"budget.epochs" = 2\n')],
     "set exactly one of budget.updates or budget.epochs"),
    ("no-budget", [('"budget.updates" = 200\n', "")],
     "budget: required key is missing"),
    ("variant-negative-lr", [('set = { "optimizer.lr" = 2e-4 }', 'set = { "optimizer.lr" = -2e-4 }')],
     'grid.variants[2].set."optimizer.lr": expected greater than 0'),
    ("variant-changes-held", [('set = { "optimizer.lr" = 5e-5 }', 'set = { "loop.microbatch" = 4 }')],
     "grid.variants[1].set.\"loop.microbatch\": variant 'lr-5e-5' changes loop.microbatch, "
     "which is held"),
    ("control-unknown", [('control = "lr-1e-4"', 'control = "lr-1e4"')],
     "grid.control: 'lr-1e4' is not a variant (did you mean 'lr-1e-4'? variants: lr-1e-4, "
     "lr-5e-5, lr-2e-4)"),
    ("duplicate-variant", [('name = "lr-2e-4"', 'name = "lr-5e-5"')],
     "variant name 'lr-5e-5' appears twice"),
    ("no-seeds", [("seeds = [0, 1, 2]", "seeds = []")], "grid.seeds: expected"),
    ("duplicate-seed", [("seeds = [0, 1, 2]", "seeds = [0, 1, 1]")],
     "grid.seeds: seed 1 appears twice"),
    ("negative-seed", [("seeds = [0, 1, 2]", "seeds = [-1, 1, 2]")], "grid.seeds[0]: expected"),
    ("seed-not-int", [("seeds = [0, 1, 2]", 'seeds = ["a", 1, 2]')],
     "grid.seeds[0]: expected a valid integer"),
    ("validation-every-zero", [("every = 25", "every = 0")], "validation.every: expected"),
    ("validation-mode", [('mode = "max"', 'mode = "maximize"')], "validation.mode: expected"),
    ("validation-metric", [('metric = "val/accuracy"', 'metric = "accuracy"')],
     "validation.metric: expected"),
    ("validation-missing", [("[validation]\nevery = 25\nmetric = \"val/accuracy\"\nmode = \"max\"\n",
                             "")], "validation: required key is missing"),
    ("wall-time", [('wall_time = "30m"', 'wall_time = "30 minutes"')], "stop.wall_time: expected"),
    ("loss-explosion", [("loss_explosion = 4.0", "loss_explosion = 0.5")],
     "stop.loss_explosion: expected greater than 1"),
    ("held-and-free", [("[config]\n", '[config]\n"loop.microbatch" = 2\n')],
     'config."loop.microbatch": also in [hold]'),
    ("variant-sets-stop", [('set = { "optimizer.lr" = 5e-5 }', 'set = { "stop.patience" = 3 }')],
     'grid.variants[1].set."stop.patience": stop settings are campaign-wide'),
    ("not-toml", [("[grid]", "[grid")], "not valid TOML"),
    ("variant-without-name", [('name = "lr-1e-4"\nset', 'set')],
     "grid.variants[0].name: required key is missing"),
    ("date-value", [("[config]\n", "[config]\n\"optimizer.lr\" = 2024-01-01\n"
                     .replace('"optimizer.lr" = 2024', '"task.when" = 2024'))],
     'config."task.when": expected'),
    ("epochs-without-size", [('"budget.updates" = 200', '"budget.epochs" = 1'),
                             ("tiny:build", "tiny:build_without_splits")],
     "variant 'lr-1e-4': an epoch budget needs the training-set size: set "
     "budget.train_examples"),
    ("overfit-error-without-threshold", [("[grid]", '[pilot]\noverfit_metric = "mse"\n\n[grid]')],
     "pilot: overfit_metric 'mse' is minimised (lower is better): set overfit_threshold"),
    ("overfit-mode-unknown", [("[grid]", '[pilot]\noverfit_metric = "r2"\noverfit_mode = "up"\n\n[grid]')],
     "pilot.overfit_mode: expected 'min' or 'max'"),
    ("metric-not-produced", [('metric = "val/accuracy"', 'metric = "val/acuracy"')],
     "validation.metric: 'val/acuracy' is not a metric this task produces (did you mean "
     "'val/accuracy'? it produces val/loss, val/accuracy)"),
    ("overfit-metric-not-produced", [("[grid]", '[pilot]\noverfit_metric = "exact_match"\n\n[grid]')],
     "pilot.overfit_metric: 'exact_match' is not a metric this task produces"),
    ("task-key-typo", [("[config]\n", '[config]\n"task.train_sise" = 64\n')],
     "config.\"task.train_sise\": unknown key of this task (did you mean 'train_size'?)"),
    ("task-key-type", [("[config]\n", '[config]\n"task.hidden" = "wide"\n')],
     "config.\"task.hidden\": expected a valid integer, got 'wide'"),
]


def _bad_spec(tmp_path: Path, edits: list[tuple[str, str]]) -> Path:
    text = SPEC.read_text()
    for old, new in edits:
        assert old in text, f"the case edits {old!r}, which the good spec lacks"
        text = text.replace(old, new, 1)
    path = tmp_path / "bad-spec.toml"
    path.write_text(text)
    return path


def _counts(url: str) -> list:
    return [execute(url, f"SELECT COUNT(*) FROM {t}") for t in TABLES]


@pytest.fixture
def planned_url(sqlite_url: str) -> str:
    """A ledger that already holds the good campaign, so "unchanged" means something."""
    result = CliRunner().invoke(main, ["--ledger", sqlite_url, "plan", str(SPEC)])
    assert result.exit_code == 0, result.stderr
    return sqlite_url


def test_there_are_at_least_25_cases() -> None:
    assert len(BAD_SPECS) >= 25
    assert len({case for case, _, _ in BAD_SPECS}) == len(BAD_SPECS)


@pytest.mark.parametrize(("case", "edits", "expected"), BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_bad_spec_refused(planned_url: str, tmp_path: Path, case: str, edits: list,
                         expected: str) -> None:
    spec = _bad_spec(tmp_path, edits)
    before = _counts(planned_url)
    result = CliRunner().invoke(main, ["--ledger", planned_url, "plan", str(spec)])
    assert result.exit_code == 2, (case, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"campaign: {spec}: "), lines[0]
    assert expected in lines[0], lines[0]
    assert result.stdout == ""
    assert _counts(planned_url) == before


def test_bad_specs_leave_a_postgresql_ledger_unchanged(postgresql_url: str, tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["--ledger", postgresql_url, "plan", str(SPEC)]).exit_code == 0
    before = _counts(postgresql_url)
    for case, edits, expected in BAD_SPECS:
        result = runner.invoke(main, ["--ledger", postgresql_url, "plan",
                                      str(_bad_spec(tmp_path, edits))])
        assert result.exit_code == 2 and expected in result.stderr, (case, result.stderr)
    assert _counts(postgresql_url) == before
