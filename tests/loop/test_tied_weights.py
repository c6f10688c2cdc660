"""Tied weights and activation checkpointing at a module path (nanoGPT's layout): checkpoints
and the final artifact store a shared tensor once and the tie holds after a load; a run from a
checkpoint continues exactly; checkpointing ``transformer.h`` leaves the gradients unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from campaign.errors import LoopError
from campaign.gates.launch_gate import open_gate
from campaign.ledger import Ledger
from campaign.loop import checkpoint as ckpt
from campaign.loop.replay import replay_artifact
from campaign.loop.task import build_task
from campaign.loop.train import execute
from campaign.loop.trainer import Trainer, checkpoint_blocks
from tests.support.loop_helpers import forward_calls, plan_loop

TASK = "tests.support.tasks.tied:build"


def _config(ledger: Ledger, name: str, **hold: Any) -> tuple[str, dict[str, Any]]:
    (run_id,) = plan_loop(ledger, name, task=TASK, hold={"budget.updates": 8, **hold},
                          config={"optimizer.lr": 3e-3})
    return run_id, ledger.run(run_id).config_document


def _losses(trainer: Trainer, updates: int) -> list[float]:
    out = []
    for _ in range(updates):
        loss_sum, units = trainer.forward_backward(trainer.batches(trainer.next_examples()))
        trainer.step()
        out.append(loss_sum / units)
    return out


def _tied(model: torch.nn.Module) -> bool:
    return model.lm_head.weight is model.transformer["wte"].weight


def test_a_tied_model_checkpoints_resumes_exactly_and_keeps_its_tie(
    sqlite_url: str, tmp_path: Path
) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        _, config = _config(ledger, "tied-exact")
    task = build_task(TASK, config)
    whole = Trainer(task, config, torch.device("cpu"))
    expected = _losses(whole, 8)
    first = Trainer(build_task(TASK, config), config, torch.device("cpu"))
    losses = _losses(first, 4)
    tensors, state = first.capture_state(step=4)
    saved = ckpt.save(tmp_path / "step-4.safetensors", tensors, state)
    stored, loaded_state = ckpt.load(saved.path, saved.sha256)
    assert "model.lm_head.weight" in stored and "model.transformer.wte.weight" in stored
    assert stored["model.lm_head.weight"] is stored["model.transformer.wte.weight"]  # once
    second = Trainer(build_task(TASK, config), config, torch.device("cpu"))
    second.restore_state(stored, loaded_state)
    assert _tied(second.model)
    losses += _losses(second, 4)
    assert losses == expected  # bit for bit on CPU
    assert _tied(second.model) and torch.equal(second.model.lm_head.weight,
                                               whole.model.lm_head.weight)


def test_a_tied_run_completes_and_its_final_artifact_replays(
    sqlite_url: str, tmp_path: Path
) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id, _ = _config(ledger, "tied-run", **{"loop.checkpoint_every": 3})
        open_gate(ledger, "tied-run", skip_reason="tied weights test")
        execute(ledger, run_id, artifacts=tmp_path / "a")
        run = ledger.run(run_id)
        artifacts = ledger.artifacts("tied-run")
    assert run.status == "completed", run.stop_detail
    final = Path(artifacts[artifacts["kind"] == "final"]["path"].iloc[0])
    identical, outputs, expected = replay_artifact(final, TASK)
    assert identical and outputs == expected
    assert len(artifacts[artifacts["kind"] == "checkpoint"]) >= 2


def test_activation_checkpointing_at_a_module_path_gives_the_same_gradients(
    sqlite_url: str,
) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        _, plain = _config(ledger, "ac-plain")
        _, checked = _config(ledger, "ac-checked", **{"loop.activation_checkpointing": True,
                                                      "loop.checkpoint_modules": "transformer.h"})
    gradients, calls = [], []
    for config in (plain, checked):
        trainer = Trainer(build_task(TASK, config), config, torch.device("cpu"))
        calls.append(forward_calls(next(trainer.model.transformer.h[0].children())))
        batches = trainer.batches(trainer.next_examples())
        trainer.forward_backward(batches)
        gradients.append({n: p.grad.clone() for n, p in trainer.model.named_parameters()})
    assert calls[1][0] == 2 * calls[0][0] > 0  # every microbatch's block recomputed once
    assert gradients[0].keys() == gradients[1].keys()
    for name in gradients[0]:
        assert torch.equal(gradients[0][name], gradients[1][name]), name
    with pytest.raises(LoopError, match=r"'transformer\.nope' is not a ModuleList"):
        checkpoint_blocks(build_task(TASK, plain).model(), "transformer.nope")
