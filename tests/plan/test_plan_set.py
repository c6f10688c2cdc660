"""``campaign plan SPEC --set KEY=VALUE``: overrides placed into the spec before it is checked,
frozen with it; the same file with other overrides is another campaign only when the question
changes (docs/spec.md, "Overrides from the command line")."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from campaign.cli import main
from campaign.ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "tests" / "support" / "specs" / "digits-lr.toml"


def cli(url: str, *args: str):
    return CliRunner().invoke(main, ["--ledger", url, *args])


def test_overrides_reach_every_run_and_are_frozen_with_the_spec(ledger_url: str) -> None:
    sets = ["--set", "loop.microbatch=4", "--set", "loop.accumulation=4",  # held in [hold]
            "--set", "optimizer.weight_decay=0.1",  # the control's [config], inherited
            "--set", "task.hidden=32",  # a task key not in the file: to [config]
            "--set", "grid.seeds=[0, 1]", "--set", "validation.every=20"]
    result = cli(ledger_url, "plan", str(SPEC), *sets, "--format", "json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["sets"] == [s for s in sets if s != "--set"]
    assert len(document["runs"]) == 6  # 3 variants x the 2 seeds given
    with Ledger.open(ledger_url) as ledger:
        runs = ledger.runs("digits-lr")
        record = ledger.campaign("digits-lr")
        events = ledger.events("digits-lr")
    assert {(c["loop"]["microbatch"], c["loop"]["accumulation"], c["optimizer"]["weight_decay"],
             c["task"]["hidden"], c["validation"]["every"]) for c in runs["config"]} == {
        (4, 4, 0.1, 32, 20)}
    assert sorted({c["optimizer"]["lr"] for c in runs["config"]}) == [5e-5, 1e-4, 2e-4]
    assert {c["budget"]["examples_seen"] for c in runs["config"]} == {200 * 16}
    frozen = record.spec_document
    assert frozen["hold"]["loop.microbatch"] == 4 and frozen["grid"]["seeds"] == [0, 1]
    assert frozen["config"]["task.hidden"] == 32
    assert record.spec_sha256 == document["spec_sha256"]
    (said,) = events.loc[events["kind"] == "overrides", "detail"]
    assert json.loads(said) == document["sets"]

    again = cli(ledger_url, "plan", str(SPEC), *sets)
    assert again.exit_code == 0 and "identical spec; nothing written" in again.stderr
    # Only the pilot's settings: how the pilot checks, not the question. The same campaign.
    pilot = cli(ledger_url, "plan", str(SPEC), *sets, "--set", "pilot.overfit_steps=90")
    assert pilot.exit_code == 0, pilot.stderr
    assert "its [pilot] settings changed" in pilot.stderr
    # Another value of a config key is another question: refused under the same name, planned
    # under another.
    other = cli(ledger_url, "plan", str(SPEC), *sets[:-2], "--set", "validation.every=25")
    assert other.exit_code == 2 and "already planned with a different spec" in other.stderr
    renamed = cli(ledger_url, "plan", str(SPEC), *sets[:-2], "--set", "validation.every=25",
                  "--set", "campaign.name=digits-lr-b")
    assert renamed.exit_code == 0, renamed.stderr
    with Ledger.open(ledger_url) as ledger:
        assert len(ledger.runs("digits-lr-b")) == 6
        assert len(ledger.runs("digits-lr")) == 6


def test_a_refused_override_names_the_override_and_writes_nothing(sqlite_url: str) -> None:
    cases = {
        "task.hiden=32": "--set task.hiden: unknown key of this task (did you mean 'hidden'?)",
        "optimizer.lr=-1": "--set optimizer.lr: every variant sets optimizer.lr itself",
        "optimizer.weight_decay=-1": "--set optimizer.weight_decay",
        "loop.accumulation=two": "--set loop.accumulation",
        "grid.control=lr-9": "grid.control",
        "campaign.nme=x": "--set campaign.nme",
        "config.optimizer.lr=1": "--set config.optimizer.lr: every variant sets optimizer.lr",
        "seed=3": "--set seed: a run's seed is one of grid.seeds",
        "foo=1": "--set foo: unknown key",  # a key the spec writes unquoted (config.foo)
        "hold.optimizer.lr=1": "--set hold.optimizer.lr: optimizer.lr is free in the spec "
                               "([config]); a key is either held or free",
    }
    for item, words in cases.items():
        result = cli(sqlite_url, "plan", str(SPEC), "--set", item)
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1, (item, result.stderr)
        assert words in lines[0] and lines[0].startswith(f"campaign: {SPEC}: "), (item, lines)
    twice = cli(sqlite_url, "plan", str(SPEC), "--set", "optimizer.weight_decay=0.1",
                "--set", "config.optimizer.weight_decay=0.2")
    assert twice.exit_code == 2 and ("--set config.optimizer.weight_decay: given more than once "
                                     "(as --set optimizer.weight_decay)") in twice.stderr
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists() or not Ledger.open(
        sqlite_url).campaigns()
