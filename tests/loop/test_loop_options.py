"""Loop options on real runs: schedules, bf16, activation checkpointing, a lost run's replay."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from campaign.errors import LoopError
from campaign.ledger import Ledger, StopRecord
from campaign.loop.task import build_task
from campaign.loop.train import execute
from campaign.loop.trainer import Trainer, accumulate, build_scheduler, checkpoint_blocks
from campaign.tasks.arithmetic import ArithmeticTask
from tests.support.loop_helpers import forward_calls, plan_loop

ROOT = Path(__file__).resolve().parents[2]


def _config(name: str, warmup: int) -> dict:
    return {"scheduler": {"name": name, "warmup": warmup}, "budget": {"updates": 10}}


def test_learning_rate_schedules() -> None:
    def rates(name: str, warmup: int) -> list[float]:
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        scheduler = build_scheduler(optimizer, _config(name, warmup))
        seen = []
        for _ in range(10):
            seen.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return seen

    assert rates("constant", 0) == [1.0] * 10
    assert rates("linear_warmup", 4)[:5] == [0.25, 0.5, 0.75, 1.0, 1.0]
    cosine = rates("cosine", 2)  # update u uses index u - 1; update 10 = the horizon
    assert cosine[:2] == [0.5, 1.0] and 0.9 < cosine[2] < 1.0
    assert all(a >= b for a, b in itertools.pairwise(cosine[1:])) and cosine[-1] == 0.0


def test_activation_checkpointing_gives_the_same_gradients() -> None:
    task = ArithmeticTask({"task": {"train_size": 32, "val_size": 4}, "loop": {}})
    batch = [task.collate(task.splits()["train"][:8])]
    torch.manual_seed(0)
    plain = task.model().double()
    torch.manual_seed(0)
    checkpointed = task.model().double()
    checkpoint_blocks(checkpointed)
    calls = [forward_calls(next(m.blocks[0].children())) for m in (plain, checkpointed)]
    accumulate(task, plain, batch)
    accumulate(task, checkpointed, batch)
    assert [c[0] for c in calls] == [1, 2]  # the checkpointed block recomputed in backward
    for (name, a), (_, b) in zip(
        plain.named_parameters(), checkpointed.named_parameters(), strict=True
    ):
        assert torch.allclose(a.grad, b.grad, atol=1e-12), name


def test_bf16_and_activation_checkpointing_run_end_to_end(sqlite_url: str, tmp_path: Path) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id = plan_loop(
            ledger,
            task="campaign.tasks.arithmetic:build",
            hold={"loop.precision": "bf16", "loop.activation_checkpointing": True},
            config={"task.train_size": 64, "task.val_size": 8, "optimizer.lr": 3e-3},
            stop={"loss_explosion": 100.0},
        )[0]
        outcome = execute(ledger, run_id, artifacts=tmp_path, replay_in_subprocess=False)
        assert outcome.status == "completed", outcome
        curve = ledger.metrics("loop", keys=["train/loss"])
        assert len(curve) == 12 and curve["value"].notna().all()
        config = ledger.run(run_id).config_document
    # The run's own trainer computes its matmuls in bf16 (autocast), in checkpointed blocks.
    trainer = Trainer(build_task("campaign.tasks.arithmetic:build", config), config,
                      torch.device("cpu"))
    linear = trainer.model.blocks[0].linear1  # the feed-forward's (attention calls F.linear)
    dtypes: list[torch.dtype] = []
    linear.register_forward_hook(lambda _m, _i, output: dtypes.append(output.dtype))
    trainer.forward_backward(trainer.batches(trainer.next_examples()))
    assert dtypes and set(dtypes) == {torch.bfloat16}
    assert len(dtypes) == 2 * config["loop"]["accumulation"]  # recomputed in each backward


def test_fp16_on_cpu_is_refused_before_any_work(sqlite_url: str, tmp_path: Path) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id = plan_loop(ledger, hold={"loop.precision": "fp16"})
        with pytest.raises(LoopError, match="fp16 with a GradScaler needs a CUDA device"):
            execute(ledger, run_id[0], artifacts=tmp_path)
        assert ledger.run(run_id[0]).status == "planned"  # nothing started


@pytest.mark.slow
def test_a_lost_run_resumes_and_its_replayed_steps_are_compared(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Killed with SIGKILL in update 7 (checkpoint at 4, metrics flushed at 6); marked lost;
    resumed: the updates it re-executes match the first values (a determinism check)."""
    marker = tmp_path / "killed"
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id = plan_loop(
            ledger,
            task="tests.support.tasks.faulty:build",
            hold={"loop.checkpoint_every": 4},
            validation={"every": 2},
            config={"task.fault": "sigkill", "task.at": 13, "task.marker": str(marker)},
        )[0]
    env = {**os.environ, "CAMPAIGN_LEDGER": sqlite_url}
    died = subprocess.run(
        [sys.executable, "-m", "campaign", "run", run_id, "--artifacts", str(tmp_path / "a"),
         "--skip-pilot", "--reason", "a task that dies"],
        cwd=ROOT,
        env=env,
        capture_output=True,
    )
    assert died.returncode == -9 and marker.exists()
    with Ledger.open(sqlite_url, create=True) as ledger:
        assert ledger.run(run_id).status == "running"  # nobody said anything
        ledger.finish(
            run_id, "lost", StopRecord("heartbeat_lost", None, None, "test: no heartbeat")
        )
        outcome = execute(ledger, run_id, artifacts=tmp_path / "a", replay_in_subprocess=False)
        assert outcome.status == "completed"
        events = ledger.events("loop", run_id=run_id)
        check = events[events["kind"] == "determinism_check"]["detail"].iloc[0]
        assert check.startswith("2 replayed steps (5-6)") and "(identical)" in check
        segments = ledger.segments("loop")
        assert list(segments["start_step"]) == [0, 4]
        both = ledger.metrics("loop", keys=["train/loss"], all_segments=True)
        assert both["step"].duplicated().any()  # the replayed steps kept both values
