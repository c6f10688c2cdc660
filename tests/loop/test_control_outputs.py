"""The final artifact's control outputs are computed with every generator seeded alike, in
the process that trains and in the one that replays: a task whose collate adds noise (as
augmentation does) replays identically wherever the replaying process's generators stood,
and writing the artifact leaves the training's random state as it was. Before, the export
drew from the training's state and the replay from its own: the pilot's export check failed
on the lazy ten-million-example task whenever the noise flipped a control prediction."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from campaign.loop.replay import replay_artifact, replay_file_in_subprocess, write_final
from campaign.loop.task import build_task

TASK = "tests.support.tasks.augmented:build_jittered"


def _states() -> tuple[object, ...]:
    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist()


def test_noisy_control_outputs_replay_identically_here_and_in_a_fresh_process(
    tmp_path: Path,
) -> None:
    config = {"task": {"train_size": 64, "val_size": 8}, "seed": 3}
    task = build_task(TASK, config)
    torch.manual_seed(11)
    model = task.model()
    torch.rand(100)  # the training's generators somewhere along its run
    before = _states()
    path = tmp_path / "final.safetensors"
    outputs = write_final(path, model, task, '{"task": {"train_size": 64, "val_size": 8}}',
                          "{}", torch.device("cpu"))
    assert _states() == before  # the export drew nothing from the training's state
    assert len(outputs) == 4 and all(len(record["logits"]) == 2 for record in outputs)

    for draws in (0, 7, 1000):  # a replaying process whose generators stand anywhere
        torch.rand(draws)
        identical, replayed, expected = replay_artifact(path, TASK)
        assert identical, (replayed, expected)
    fresh = replay_file_in_subprocess(path, TASK)
    assert fresh.get("identical"), fresh
    assert fresh["outputs"] == outputs


def test_a_replay_child_whose_ledger_is_gone_says_why_and_raises_nothing(tmp_path: Path) -> None:
    """A run's own replay check is evidence, never the run's end: a project error in its child
    (here the ledger it reopens is gone) comes back as the reason it could not replay."""
    from campaign.ledger import Ledger
    from campaign.loop.replay import EarlyReplay
    from tests.support.loop_helpers import plan_loop

    path = tmp_path / "ledger.db"
    with Ledger.open(f"sqlite:///{path}", create=True) as ledger:
        (run_id, *_) = plan_loop(ledger)
        early = EarlyReplay(ledger, run_id, "tests.support.tasks.quick:build")
        path.rename(tmp_path / "moved.db")  # the child opens the ledger only when told to go
        why = early.result()
    assert why is not None and why.how == "failed" and str(path) in why.why
