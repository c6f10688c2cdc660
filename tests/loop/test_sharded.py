"""Sharded runs (``loop.strategy = "fsdp"``, PyTorch's FSDP2 on gloo): the series of one
process, checkpoints of shards that resume exactly on the same and on another number of ranks,
and the full model as the final artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from campaign.ledger import Ledger
from campaign.loop import checkpoint as ckpt
from campaign.loop import replicas as dp
from campaign.loop import shard_files
from campaign.loop.train import execute
from tests.support.launch_helpers import run
from tests.support.loop_helpers import plan_loop

ARITHMETIC = "campaign.tasks.arithmetic:build"
SMALL = {"task.train_size": 300, "task.val_size": 16, "task.width": 32, "task.layers": 2,
         "optimizer.name": "adamw", "optimizer.lr": 3e-3, "loop.clip_grad_norm": 1.0}


def series(ledger: Ledger, run_id: str) -> pd.DataFrame:
    points = ledger.metrics(runs=[run_id], keys=["train/loss", "train/grad_norm"])
    return points.pivot(index="step", columns="key", values="value")


def plan_arithmetic(ledger: Ledger, name: str, updates: int, hold: dict[str, Any]) -> str:
    return plan_loop(ledger, name, task=ARITHMETIC, config=SMALL, seeds=[3],
                     # checkpoints apart from validations: a forward without backward is
                     # followed by an update (FSDP2 leaves the root gathered after one)
                     hold={"loop.microbatch": 3, "budget.updates": updates,
                           "loop.checkpoint_every": 7, **hold},
                     validation={"every": 10, "metric": "val/accuracy", "sample": 8})[0]


def worker(url: str, name: str, artifacts: Path, *extra: str, exit_code: int = 0) -> Any:
    done = run(url, "worker", name, "--artifacts", str(artifacts), "--skip-pilot",
               "--reason", "sharding test", "--no-replay-check", *extra)
    assert done.returncode == exit_code, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_a_sharded_run_takes_one_process_updates_and_writes_the_full_model(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    ledger = sqlite_ledger
    single = plan_arithmetic(ledger, "single", 50, {"loop.accumulation": 4})
    execute(ledger, single, artifacts=tmp_path / "single", replay_in_subprocess=False)
    sharded = plan_arithmetic(ledger, "sharded", 50, {"loop.accumulation": 2,
                                                     "loop.replicas": 2,
                                                     "loop.strategy": "fsdp"})
    worker(sqlite_url, "sharded", tmp_path / "a")
    record = ledger.run(sharded)
    assert (record.status, record.stop_step) == ("completed", 50), record
    ours, theirs = series(ledger, sharded), series(ledger, single)
    assert len(ours) == 50
    pd.testing.assert_frame_equal(ours, theirs, check_exact=False, rtol=1e-6, atol=0)
    events = ledger.events("sharded")
    sharding = events[events["kind"] == "sharding"]["detail"].tolist()
    assert sharding == ["FSDP2 over 2 ranks, 2 units: the task's shard_units()"]
    # The final artifact is the full model: exactly the shards of the last checkpoint, joined.
    artifacts = ledger.artifacts("sharded")
    final = artifacts.query("kind == 'final'")["path"].iloc[0]
    last = artifacts.query("kind == 'checkpoint'").sort_values("step").iloc[-1]
    assert Path(last["path"]).with_name(Path(last["path"]).stem + ".rank-1.safetensors").is_file()
    tensors, state = shard_files.load(Path(last["path"]), last["sha256"], dp.Replica(0, 1))
    saved = ckpt.join_state(state["model"], tensors)
    reference = load_file(ledger.artifacts("single").query("kind == 'final'")["path"].iloc[0])
    with safe_open(final, "pt") as mine:
        assert sorted(mine.keys()) == sorted(saved) == sorted(reference)
        for key in saved:
            assert torch.equal(mine.get_tensor(key), saved[key]), key
            assert mine.get_tensor(key).shape == reference[key].shape


FAULTY = "tests.support.tasks.sharded_fault:build"


def plan_faulty(ledger: Ledger, name: str, marker: Path, hold: dict[str, Any],
                fault: str = "sigterm") -> str:
    return plan_loop(ledger, name, task=FAULTY, seeds=[3],
                     config={**SMALL, "task.fault": fault, "task.at": 15,
                             "task.marker": str(marker)},
                     hold={"loop.microbatch": 3, "budget.updates": 20, "loop.strategy": "fsdp",
                           "loop.checkpoint_every": 4, **hold},
                     validation={"every": 10, "metric": "val/accuracy", "sample": 8})[0]


@pytest.mark.slow
def test_a_sharded_run_resumes_bit_for_bit_on_its_ranks_and_resharded_on_fewer(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    ledger, hold = sqlite_ledger, {"loop.replicas": 2, "loop.accumulation": 2}
    never = tmp_path / "never"
    never.touch()  # the marker exists: this run is never interrupted
    reference = plan_faulty(ledger, "reference", never, hold)
    worker(sqlite_url, "reference", tmp_path / "a")
    expected = series(ledger, reference)
    assert len(expected) == 20

    # Interrupted at update 8 (its 15th microbatch on a rank), resumed on 2 ranks.
    same = plan_faulty(ledger, "same", tmp_path / "m1", hold)
    worker(sqlite_url, "same", tmp_path / "a", exit_code=1)  # its run was interrupted
    assert ledger.run(same).status == "interrupted"
    step = ledger.run(same).stop_step
    assert 0 < step < 20
    worker(sqlite_url, "same", tmp_path / "a", "--resume-interrupted")
    assert (ledger.run(same).status, ledger.run(same).stop_step) == ("completed", 20)
    pd.testing.assert_frame_equal(series(ledger, same), expected, check_exact=True)
    assert "resharded" not in set(ledger.events("same")["kind"])

    # The same interruption resumed in one process: the shards joined, the batch the same.
    fewer = plan_faulty(ledger, "fewer", tmp_path / "m2", hold)
    worker(sqlite_url, "fewer", tmp_path / "a", exit_code=1)
    assert ledger.run(fewer).status == "interrupted"
    # Its newest checkpoint's rank 1 shard damaged: the resume falls back to the one before.
    saved = ledger.artifacts("fewer").query("kind == 'checkpoint'").sort_values("step")
    newest = Path(saved["path"].iloc[-1])
    shard = newest.with_name(newest.stem + ".rank-1.safetensors")
    shard.write_bytes(shard.read_bytes()[:-8] + b"damaged!")
    done = run(sqlite_url, "resume", fewer, "--ranks", "1", "--artifacts", str(tmp_path / "a"),
               "--no-replay-check")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (ledger.run(fewer).status, ledger.run(fewer).stop_step) == ("completed", 20)
    pd.testing.assert_frame_equal(series(ledger, fewer), expected, check_exact=False,
                                  rtol=1e-6, atol=0)
    events = ledger.events("fewer").set_index("kind")["detail"]
    assert events["resharded"] == "segment 2: resumed on 1 ranks from shards of 2"
    assert (f"(step {saved['step'].iloc[-2]}); newer ones skipped: {newest} (step "
            f"{saved['step'].iloc[-1]}): its rank 1 shard {shard.name} does not match the "
            "index") in events["resume_fallback"]

    # Rank 1's process killed outright (the OOM killer's way): not the run's fault. It ends
    # interrupted at its last checkpoint, like a run whose own process was killed, and resumes
    # bit for bit.
    killed = plan_faulty(ledger, "killed", tmp_path / "m4", hold, fault="sigkill_rank1")
    worker(sqlite_url, "killed", tmp_path / "a")  # a kill is the run's event: the worker goes on
    record = ledger.run(killed)
    assert (record.status, record.stop_cause) == ("interrupted", "killed"), record.stop_detail
    assert "the run's rank 1 (pid " in record.stop_detail
    assert "was killed by SIGKILL" in record.stop_detail
    last = ledger.artifacts("killed").query("kind == 'checkpoint'")["step"].max()
    assert f"its last checkpoint is at update {last}" in record.stop_detail
    assert last < record.stop_step < 20  # the update it was in; the resume replays from last
    kills = ledger.events("killed").query("kind == 'killed'")["detail"].tolist()
    assert len(kills) == 1 and "rank 1 (pid" in kills[0], kills
    worker(sqlite_url, "killed", tmp_path / "a", "--resume-interrupted")
    assert (ledger.run(killed).status, ledger.run(killed).stop_step) == ("completed", 20)
    pd.testing.assert_frame_equal(series(ledger, killed), expected, check_exact=True)

    # Four ranks interrupted, resumed on two (a lost node): the same effective batch of 12.
    four = plan_faulty(ledger, "four", tmp_path / "m3", {"loop.replicas": 4,
                                                         "loop.accumulation": 1})
    worker(sqlite_url, "four", tmp_path / "a", exit_code=1)
    assert ledger.run(four).status == "interrupted"
    saved = ledger.artifacts("four").query("kind == 'checkpoint'").sort_values("step")
    newest, oldest = Path(saved["path"].iloc[-1]), Path(saved["path"].iloc[0])
    assert sorted(p.name for p in newest.parent.glob(newest.stem + ".rank-*")) == [
        f"{newest.stem}.rank-{r}.safetensors" for r in (1, 2, 3)]
    assert not oldest.exists() and not list(oldest.parent.glob(oldest.stem + ".rank-*"))
    worker(sqlite_url, "four", tmp_path / "a", "--resume-interrupted", "--ranks", "2")
    assert (ledger.run(four).status, ledger.run(four).stop_step) == ("completed", 20)
    pd.testing.assert_frame_equal(series(ledger, four), expected, check_exact=False,
                                  rtol=1e-6, atol=0)
    events = ledger.events("four")
    assert events[events["kind"] == "resharded"]["detail"].tolist() == [
        "segment 2: resumed on 2 ranks from shards of 4"]


def test_ranks_beyond_the_devices_are_refused_in_one_line() -> None:
    from campaign.stack.devices import ranks_problem

    assert ranks_problem(4, "cpu", available=0) is None  # CPU ranks share the CPU
    assert ranks_problem(2, "cuda:0", available=2) is None
    assert ranks_problem(1, "cuda:3", available=1) is None  # one rank: the device's own check
    problem = ranks_problem(4, "cuda:1", available=4)
    assert problem is not None and "\n" not in problem
    assert problem.startswith("loop.replicas = 4 needs cuda:1..cuda:4, one device per rank; "
                              "this machine has 4 CUDA device(s)")


def test_a_sharded_variant_whose_units_are_not_in_the_model_is_refused_at_plan(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "shard.toml"
    spec.write_text(f"""
[campaign]
name = "shard"
question = "does it shard?"
task = "{ARITHMETIC}"
[hold]
"loop.microbatch" = 4
"loop.replicas" = 2
"loop.strategy" = "fsdp"
"budget.updates" = 10
[validation]
every = 5
metric = "val/accuracy"
mode = "max"
[grid]
seeds = [0]
control = "blocks"
variants = [{{name = "blocks"}}, {{name = "typo", set = {{"loop.shard_modules" = "layer"}}}}]
""")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    done = run(url, "plan", str(spec))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"campaign: {spec}: campaign.task: loop.shard_modules = 'layer' is not a module list "
        "of the model (name the list of repeated blocks, e.g. 'transformer.h')"]


@pytest.mark.slow
def test_a_sharded_model_with_tied_weights_reshards_and_writes_them_once(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    """nanoGPT's tie (the embedding is the output layer's weight): each rank's file stores
    its shard once, the other name an alias; reading it back on another count of ranks
    resolves the alias, and the full artifact stores the tie once, as one process does."""
    from campaign.loop.replay import load_final_model

    plan_loop(sqlite_ledger, "tied", task="tests.support.tasks.tied:build", seeds=[0],
              hold={"loop.microbatch": 4, "loop.accumulation": 1, "loop.replicas": 2,
                    "loop.strategy": "fsdp", "loop.shard_modules": "transformer.h",
                    "budget.updates": 8, "loop.checkpoint_every": 4},
              config={"optimizer.name": "adamw", "optimizer.lr": 1e-2},
              validation={"every": 4, "metric": "val/accuracy"})
    worker(sqlite_url, "tied", tmp_path / "a")
    artifacts = sqlite_ledger.artifacts("tied")
    last = artifacts.query("kind == 'checkpoint'").sort_values("step").iloc[-1]
    tensors, state = shard_files.load(Path(last["path"]), last["sha256"], dp.Replica(0, 1))
    saved = ckpt.join_state(state["model"], tensors)
    assert torch.equal(saved["lm_head.weight"], saved["transformer.wte.weight"])
    assert saved["lm_head.weight"].shape == (16, 16)
    final = artifacts.query("kind == 'final'")["path"].iloc[0]
    with safe_open(final, "pt") as handle:
        stored = set(handle.keys())  # stored once (the first name), the other an alias
        assert "lm_head.weight" in stored and "transformer.wte.weight" not in stored
    _, model, _ = load_final_model(Path(final), "tests.support.tasks.tied:build")
    assert model.lm_head.weight.data_ptr() == model.transformer["wte"].weight.data_ptr()
    assert torch.equal(model.lm_head.weight, saved["transformer.wte.weight"])


@pytest.mark.slow
def test_a_bf16_sharded_runs_final_artifact_replays_identically_in_a_fresh_process(
    sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    """bf16 is the loop's autocast under FSDP too (float32 parameters gathered): the control
    outputs written at export are what a float32 replay in a fresh process computes."""
    run_id = plan_arithmetic(sqlite_ledger, "bf16", 8, {"loop.accumulation": 1,
                                                      "loop.replicas": 2,
                                                      "loop.strategy": "fsdp",
                                                      "loop.precision": "bf16"})
    done = run(sqlite_url, "worker", "bf16", "--artifacts", str(tmp_path / "a"),
               "--skip-pilot", "--reason", "bf16 replay")
    assert done.returncode == 0, done.stderr[-3000:]
    assert sqlite_ledger.run(run_id).status == "completed"
    replayed = run(sqlite_url, "replay", run_id)
    assert replayed.returncode == 0, replayed.stderr
    assert "control outputs identical after reload" in replayed.stderr
    events = sqlite_ledger.events("bf16")
    assert not events[events["kind"] == "replay"]["detail"].str.contains("DIFFER|failed").any()
