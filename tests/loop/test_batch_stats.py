"""Accumulation with batch-statistics layers is not one big batch (issue 26, item 5): the
claim is measured false here on a real BatchNorm model, and plan and the pilot say so."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from click.testing import CliRunner

from campaign.cli import main
from campaign.ledger import Ledger
from campaign.loop.batch_stats import accumulation_warning, batch_stat_layers
from campaign.pilot.phase_gates import PilotRun
from tests.support.loop_helpers import plan_loop

SPEC = Path(__file__).parents[1] / "support" / "specs" / "digits-lr.toml"


def test_two_microbatches_of_8_are_not_one_batch_of_16() -> None:
    """Why the warning exists: the same 16 examples, summed losses over 2x8 and 1x16."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.Linear(8, 3))
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))

    def gradient(chunks: int) -> torch.Tensor:
        model.zero_grad()
        for part_x, part_y in zip(x.chunk(chunks), y.chunk(chunks), strict=True):
            (torch.nn.functional.cross_entropy(model(part_x), part_y, reduction="sum") / 16
             ).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    assert (gradient(2) - gradient(1)).abs().max() > 1e-3
    plain = torch.nn.Sequential(torch.nn.Linear(4, 3))
    assert batch_stat_layers(plain) == [] and batch_stat_layers(model) == ["1 (BatchNorm1d)"]


def test_the_warning_names_the_layers_and_the_reasons() -> None:
    layers = ["net.1 (BatchNorm1d)"]
    one = [{"loop": {"microbatch": 8, "accumulation": 1}}]
    assert accumulation_warning(layers, one) is None
    assert accumulation_warning([], [{"loop": {"microbatch": 8, "accumulation": 4}}]) is None
    both = accumulation_warning(layers, [{"loop": {"microbatch": 8, "accumulation": 2}},
                                         {"loop": {"microbatch": 16, "accumulation": 1}}])
    assert both is not None and "net.1 (BatchNorm1d)" in both
    assert "accumulation 2 normalises each microbatch" in both
    assert "variants with microbatch 8, 16 also differ" in both


def test_plan_and_the_pilot_warn_on_a_batchnorm_model(ledger: Ledger, tmp_path: Path,
                                                      sqlite_url: str) -> None:
    spec = tmp_path / "normed.toml"
    spec.write_text(SPEC.read_text().replace("tests.support.tasks.tiny:build",
                                             "tests.support.tasks.normed:build"))
    done = CliRunner().invoke(main, ["--ledger", sqlite_url, "plan", str(spec), "--dry-run",
                                     "--format", "json"])
    assert done.exit_code == 0, done.stderr
    warned = json.loads(done.stdout)["warnings"]
    assert any("batch-statistics layers (1 (BatchNorm1d))" in w for w in warned), warned
    assert "campaign: warning: the model has batch-statistics layers" in done.stderr
    plain = CliRunner().invoke(main, ["--ledger", sqlite_url, "plan", str(SPEC), "--dry-run",
                                      "--format", "json"])
    assert not any("batch-statistics" in w for w in json.loads(plain.stdout)["warnings"])
    run_config = ledger.runs(plan_loop(ledger, task="tests.support.tasks.normed:build") and "loop"
                             ).iloc[0]["config"]
    records = PilotRun("tests.support.tasks.normed:build", run_config, tmp_path / "pilot").run()
    backward = next(r for r in records if r.phase == "backward")
    assert backward.verdict == "pass"
    assert "(warning: the model has batch-statistics layers" in backward.detail


def test_every_batch_statistics_layer_is_named() -> None:
    """Running statistics or not: a BatchNorm without them normalises by the batch in
    evaluation too; a SyncBatchNorm shares its statistics across replicas, not microbatches."""
    untracked = torch.nn.Sequential(torch.nn.Linear(4, 8),
                                    torch.nn.BatchNorm1d(8, track_running_stats=False))
    assert batch_stat_layers(untracked) == ["1 (BatchNorm1d)"]
    synced = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.SyncBatchNorm(8))
    assert batch_stat_layers(synced) == ["1 (SyncBatchNorm)"]
    replicated = [{"loop": {"microbatch": 8, "accumulation": 1, "replicas": 2}}]
    warned = accumulation_warning(["1 (BatchNorm1d)"], replicated)
    assert warned is not None and "replicas 2 normalise each replica's microbatch" in warned
    assert accumulation_warning(["1 (SyncBatchNorm)"], replicated) is None


def test_a_tasks_own_batch_mean_layer_is_found_by_running_it() -> None:
    from campaign.loop.batch_stats import coupled_layers
    from campaign.loop.task import build_task

    config = {"task": {"limit": 64}}
    task = build_task("tests.support.tasks.normed:centred", config)
    model = task.model()
    examples = list(task.splits()["train"])[:16]
    state = torch.get_rng_state()
    found = coupled_layers(task, model, examples, torch.device("cpu"), microbatch=8)
    assert found and found[0].startswith("1 (BatchMean")
    assert torch.equal(torch.get_rng_state(), state) and model.training
    plain = build_task("campaign.tasks.digits:build", config)  # dropout is not coupling
    assert coupled_layers(plain, plain.model(), examples, torch.device("cpu"), microbatch=8) == []
    normed = build_task("tests.support.tasks.normed:build", config)
    bn_model = normed.model()
    before = bn_model[1].running_mean.clone()
    assert coupled_layers(normed, bn_model, examples, torch.device("cpu"), microbatch=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # kernels by batch size: not coupling
        wide = torch.nn.Sequential(torch.nn.Linear(64, 2048), torch.nn.Linear(2048, 512),
                                   torch.nn.Linear(512, 10))
    assert coupled_layers(plain, wide, examples, torch.device("cpu"), microbatch=8,
                          autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16)) == []
    assert torch.equal(bn_model[1].running_mean, before)  # the probe changed no statistic


def test_a_relaunch_that_recuts_the_update_of_a_batchnorm_model_is_warned(
        ledger: Ledger, tmp_path: Path, sqlite_url: str) -> None:
    spec = tmp_path / "normed.toml"
    spec.write_text(SPEC.read_text().replace("tests.support.tasks.tiny:build",
                                             "tests.support.tasks.normed:build"))
    assert CliRunner().invoke(main, ["--ledger", sqlite_url, "plan", str(spec)]).exit_code == 0
    with Ledger.open(sqlite_url) as opened:
        run_id = opened.runs("digits-lr").iloc[0]["run_id"]
    recut = CliRunner().invoke(main, ["--ledger", sqlite_url, "relaunch", run_id, "--set",
                                      "loop.accumulation=2", "--reason", "memory"])
    assert recut.exit_code == 0, recut.stderr
    assert "relaunch's loop.accumulation" in recut.stderr and "(BatchNorm1d)" in recut.stderr
    same = CliRunner().invoke(main, ["--ledger", sqlite_url, "relaunch", run_id, "--set",
                                     "optimizer.lr=0.5", "--reason", "rate"])
    assert same.exit_code == 0 and "batch-statistics" not in same.stderr
