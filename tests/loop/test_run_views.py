"""One run from the command line: ``run --no-replay-check`` (as ``launch`` and ``worker`` have
it) and ``campaign curve`` (the run's curves update by update, with ``train/update_s``)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from campaign.cli import main
from campaign.ledger import Ledger
from tests.support.loop_helpers import plan_loop


def test_a_run_without_its_replay_check_and_its_curve(sqlite_url: str, tmp_path: Path) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id, waiting = plan_loop(ledger, seeds=[0, 1])
    empty = CliRunner().invoke(main, ["--ledger", sqlite_url, "curve", waiting])
    assert empty.exit_code == 2 and "has recorded no metric yet (it is planned)" in empty.stderr
    done = CliRunner().invoke(main, ["--ledger", sqlite_url, "run", run_id, "--artifacts",
                                     str(tmp_path / "a"), "--skip-pilot", "--reason", "views",
                                     "--no-replay-check"])
    assert done.exit_code == 0, done.output
    with Ledger.open(sqlite_url) as ledger:
        events = ledger.events("loop")
        losses = ledger.metrics("loop", keys=["train/loss"]).sort_values("step")
    assert "replay" not in set(events["kind"])  # not replayed, as asked
    shown = CliRunner().invoke(main, ["--ledger", sqlite_url, "curve", run_id, "--format",
                                      "json"])
    assert shown.exit_code == 0, shown.output
    document = json.loads(shown.stdout)
    assert document["keys"] == ["train/loss", "val/accuracy"]  # the defaults: the spec's metric
    points = document["points"]
    assert [p["step"] for p in points] == list(range(1, 13))
    assert [p["train/loss"] for p in points] == losses["value"].tolist()
    assert [p["examples_seen"] for p in points] == [8 * s for s in range(1, 13)]
    assert [p["step"] for p in points if p["val/accuracy"] is not None] == [4, 8, 12]
    timed = CliRunner().invoke(main, ["--ledger", sqlite_url, "curve", run_id, "--key",
                                      "train/update_s", "--format", "csv"])
    rows = timed.stdout.strip().splitlines()
    assert rows[0] == "step,examples_seen,train/update_s" and len(rows) == 13
    assert all(float(row.split(",")[2]) > 0 for row in rows[1:])  # every update timed
    wrong = CliRunner().invoke(main, ["--ledger", sqlite_url, "curve", run_id, "--key", "nope"])
    assert wrong.exit_code == 2 and "recorded no such metric (it has " in wrong.stderr
    assert "train/update_s" in wrong.stderr and wrong.stderr.count("\n") == 1

    # The replay runs on the training device where this machine has it, else on the CPU.
    import torch

    replayed = CliRunner().invoke(main, ["--ledger", sqlite_url, "replay", run_id, "--device",
                                         "cuda:0"])
    assert replayed.exit_code == 0, replayed.output
    with Ledger.open(sqlite_url) as ledger:
        detail = ledger.events("loop").query("kind == 'replay'")["detail"].iloc[-1]
    where = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert f" on {where}: 4 control inputs, outputs identical" in detail, detail


def test_a_curve_with_infinities_is_strict_json(sqlite_url: str) -> None:
    """A diverging run logs an infinite loss: `curve --format json` printed `Infinity`, which
    no strict JSON parser (jq, JavaScript's JSON.parse) reads. Infinities and NaN are null."""
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id, _ = plan_loop(ledger, seeds=[0, 1])
        claim = ledger.claim_next("loop", "test")
        assert claim is not None and claim.run_id == run_id
        with ledger.metric_writer(run_id, claim.segment_id) as metrics:
            for step, value in ((1, 2.5), (2, float("inf")), (3, float("-inf")),
                                (4, float("nan"))):
                metrics.log("train/loss", step, value, 8 * step)
    shown = CliRunner().invoke(main, ["--ledger", sqlite_url, "curve", run_id, "--key",
                                      "train/loss", "--format", "json"])
    assert shown.exit_code == 0, shown.output

    def refuse(token: str) -> None:
        raise AssertionError(f"{token} is not JSON")

    document = json.loads(shown.stdout, parse_constant=refuse)
    assert [p["train/loss"] for p in document["points"]] == [2.5, None, None, None]
