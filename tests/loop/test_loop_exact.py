"""Exactness: accumulation equals one big batch, the prompt is out of the loss, resume is exact."""

from __future__ import annotations

import subprocess
from pathlib import Path

import torch

from campaign.ledger import Ledger
from campaign.loop.trainer import accumulate
from campaign.tasks.arithmetic import IGNORE, ArithmeticTask
from tests.support.launch_helpers import invoke
from tests.support.loop_helpers import plan_loop

ROOT = Path(__file__).resolve().parents[2]


def _arithmetic() -> tuple[ArithmeticTask, list[dict]]:
    task = ArithmeticTask({"task": {"digits": 3, "train_size": 64, "val_size": 8}, "loop": {}})
    return task, list(task.splits()["train"])


def _gradients(task: ArithmeticTask, model: torch.nn.Module, chunks: list[list[dict]]) -> dict:
    model.zero_grad(set_to_none=True)
    accumulate(task, model, [task.collate(c) for c in chunks])
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_accumulation_equals_one_big_batch_in_float64() -> None:
    task, examples = _arithmetic()
    torch.manual_seed(0)
    model = task.model().double()
    batch = examples[:16]
    lengths = {len(task.encode(e)[0]) for e in batch}
    assert len(lengths) > 1, "the test needs variable lengths (and so padding)"
    split = _gradients(task, model, [batch[i : i + 2] for i in range(0, 16, 2)])
    whole = _gradients(task, model, [batch])
    assert _max_difference(split, whole) <= 1e-6
    # A last incomplete batch (13 examples: six microbatches of 2 and one of 1).
    last = examples[16:29]
    split = _gradients(task, model, [last[i : i + 2] for i in range(0, 13, 2)])
    whole = _gradients(task, model, [last])
    assert _max_difference(split, whole) <= 1e-6
    # And it is not the mean of per-microbatch means, which would differ:
    model.zero_grad(set_to_none=True)
    for i in range(0, 13, 2):
        loss_sum, units = task.loss(model, task.collate(last[i : i + 2]))
        (loss_sum / units / 7).backward()
    naive = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert _max_difference(naive, whole) > 1e-6


def test_prompt_tokens_contribute_nothing_to_the_loss() -> None:
    task, examples = _arithmetic()
    torch.manual_seed(0)
    model = task.model().double()
    captured = {}

    def keep(_module: torch.nn.Module, _inputs: object, output: torch.Tensor) -> None:
        output.retain_grad()
        captured["logits"] = output

    model.head.register_forward_hook(keep)
    batch = task.collate(examples[:8])
    loss_sum, units = task.loss(model, batch)
    loss_sum.backward()
    grad = captured["logits"].grad.abs().sum(dim=-1)  # per position
    ignored = batch["targets"] == IGNORE
    assert float(grad[ignored].max()) == 0.0  # prompt and padding positions: no gradient at all
    assert bool((grad[~ignored] > 0).all())  # every answer position has one
    assert int(units) == int((~ignored).sum())


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The command in this process; its run trains in a fresh child of the task host."""
    return invoke(url, *args)


def test_resume_after_sigterm_is_exact(sqlite_url: str, tmp_path: Path) -> None:
    """Interrupted mid-run by a real SIGTERM, resumed in a new process: the same series."""
    marker = tmp_path / "signalled"
    with Ledger.open(sqlite_url, create=True) as ledger:
        plain = plan_loop(ledger, "plain", task="tests.support.tasks.faulty:build")[0]
        cut = plan_loop(
            ledger,
            "cut",
            task="tests.support.tasks.faulty:build",
            config={"task.fault": "sigterm", "task.at": 11, "task.marker": str(marker)},
        )[0]
    artifacts = str(tmp_path / "artifacts")
    # The reference: uninterrupted, in a fresh child of the host as the others (a long-lived
    # test process may lay its tensors out otherwise, and kernels may round the last bit apart).
    reference = _cli(sqlite_url, "run", plain, "--artifacts", artifacts, "--skip-pilot",
                     "--reason", "exactness test")
    assert reference.returncode == 0, reference.stderr
    interrupted = _cli(sqlite_url, "run", cut, "--artifacts", artifacts, "--skip-pilot",
                       "--reason", "exactness test")
    assert interrupted.returncode == 1 and "interrupted" in interrupted.stderr
    assert marker.exists()
    with Ledger.open(sqlite_url, create=True) as ledger:
        run = ledger.run(cut)
        assert (run.status, run.stop_cause) == ("interrupted", "interrupted")
        k = run.stop_step
        assert 1 < k < 12
    resumed = _cli(sqlite_url, "resume", cut, "--artifacts", artifacts)
    assert resumed.returncode == 0, resumed.stderr
    with Ledger.open(sqlite_url, create=True) as ledger:
        assert ledger.run(cut).status == "completed"
        a = ledger.metrics("plain").set_index(["key", "step"])["value"]
        b = ledger.metrics("cut").set_index(["key", "step"])["value"]
        segments = ledger.segments("cut")
        kinds = list(ledger.events("cut", run_id=cut)["kind"])
    keys = ["train/loss", "train/grad_norm", "val/loss", "val/accuracy"]
    a = a[a.index.get_level_values("key").isin(keys)]
    b = b[b.index.get_level_values("key").isin(keys)]
    assert len(a) == len(b) == 12 * 2 + 3 * 2
    a, b = a.sort_index(), b.sort_index()
    assert (a == b).all(), a[a != b].to_frame('reference').join(b[a != b].rename('resumed'))
    assert list(segments["ordinal"]) == [1, 2] and list(segments["start_step"]) == [0, k]
    kinds = [k for k in kinds if k != "pilot_skipped"]  # the run's recorded skip of the pilot
    assert kinds[:4] == ["planned", "running", "interrupted", "resumed"]
    assert kinds[-2:] == ["replay", "completed"]  # the final artifact, replayed in a new process
    with Ledger.open(sqlite_url, create=True) as ledger:
        replay = ledger.events("cut", run_id=cut)
    assert "outputs identical" in replay[replay["kind"] == "replay"]["detail"].iloc[0]
