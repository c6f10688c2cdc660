"""The campaign's causal-LM or classifier run taken again by Hugging Face's own ``Trainer``.

Shared by the parity test (``tests/tasks/test_hf_parity.py``: the same updates to float32
rounding) and the speed benchmark (``benchmarks/hf_trainer.py``: the same updates, timed).
The Trainer gets the same base (built by the task from the same seed), the same examples
in the campaign's order (``update_order``, fed sequentially), the task's own collate and
loss sum, normalised by the effective batch's target count (the Trainer's
``num_items_in_batch``), AdamW, warm-up then cosine in its own convention, clipping.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from campaign.ledger import Ledger
from campaign.loop.order_view import update_order
from campaign.loop.task import build_task
from campaign.loop.train import execute
from campaign.loop.trainer import seed_everything
from tests.support.loop_helpers import plan_loop

TASK = "campaign.tasks.causal_lm:build"
HELD = ("loop.microbatch", "loop.accumulation", "loop.clip_grad_norm")
WARMUP, LR, DECAY, CLIP, MICROBATCH, ACCUMULATION = 4, 3e-3, 0.01, 1.0, 2, 4


def parity_config(data: dict[str, Path], shape: dict[str, Any],
                  adapter: dict[str, Any]) -> dict[str, Any]:
    """The flat config both sides run: a Llama of ``shape`` on ``data`` with a 300-token
    trained tokenizer, ``adapter`` (task keys, e.g. LoRA), AdamW with decay on what the
    Trainer decays (``no_bias_norm``), warm-up then ``hf_cosine``, clipping, microbatch 2 x
    accumulation 4."""
    flat = {f"task.data.{k}": str(v) for k, v in data.items()}
    flat |= {f"task.model_config.{k}": v for k, v in {"architecture": "llama", **shape}.items()}
    flat |= {f"task.{k}": v for k, v in {"vocab_size": 300, "max_new_tokens": 4, **adapter}.items()}
    return {**flat, "optimizer.name": "adamw", "optimizer.lr": LR,
            "optimizer.weight_decay": DECAY, "optimizer.decay": "no_bias_norm",
            "scheduler.name": "hf_cosine", "scheduler.warmup": WARMUP,
            "loop.microbatch": MICROBATCH, "loop.accumulation": ACCUMULATION,
            "loop.clip_grad_norm": CLIP}


def campaign_run(url: str, artifacts: Path, name: str, config: dict[str, Any], updates: int,
                 command: bool = False, task: str = TASK,
                 metric: str = "val/exact_match") -> tuple[dict[str, Any], dict[str, Any]]:
    """Plan and run one causal-LM run (replay included) for ``updates``: in this process, or
    with ``command`` through ``campaign run RUN_ID`` as a user types it (its own process, its
    task host, the run in a forked child, the replay in another).

    Returns its resolved config and, per update, ``train/loss``, ``train/grad_norm`` and
    ``stamps``: the wall time each update's loss point was logged at; and ``began`` and
    ``ended``: the wall time around the run (model and data set-up, training, the last
    validation, checkpoint, export and replay).
    """
    hold = {"budget.updates": updates, **{k: config[k] for k in HELD}}
    with Ledger.open(url, create=True) as ledger:
        run_id = plan_loop(ledger, name, task=task, hold=hold,
                           config={k: v for k, v in config.items() if k not in HELD},
                           validation={"every": updates, "metric": metric,
                                       "sample": 2}, stop={"loss_explosion": None})[0]
        began = time.time()
        if command:
            script = Path(sys.executable).with_name("campaign")  # this environment's
            subprocess.run([str(script), "--ledger", url, "run", run_id, "--skip-pilot",
                            "--reason", "timed", "--artifacts", str(artifacts)],
                           check=True, capture_output=True)
        else:
            outcome = execute(ledger, run_id, artifacts=artifacts, replay_in_subprocess=False)
            assert outcome.status == "completed", outcome
        ended = time.time()
        points = ledger.metrics(name, keys=["train/loss", "train/grad_norm"])
        resolved = ledger.run(run_id).config_document
    series = {key.removeprefix("train/"): points[points["key"] == key].sort_values("step")
              for key in ("train/loss", "train/grad_norm")}
    return resolved, {"train/loss": series["loss"]["value"].tolist(),
                      "train/grad_norm": series["grad_norm"]["value"].tolist(),
                      "stamps": series["loss"]["wall_time"].tolist(),
                      "began": began, "ended": ended}


def trainer_run(resolved: dict[str, Any], folder: Path, task_reference: str = TASK,
                labels: str = "targets") -> dict[str, Any]:
    """Train ``resolved`` (a run's resolved config) with ``transformers.Trainer``; the task's
    batch field ``labels`` is what the Trainer counts the effective batch's units by.

    Returns ``loss`` and ``grad_norm`` per update, and ``stamps``: ``perf_counter`` at the
    end of every update (the Trainer's ``on_step_end``), for the speed benchmark, ``began``
    and ``ended`` around ``train()`` (the same clock); and the model's ``parameters`` count.
    """
    from torch.utils.data import Dataset, SequentialSampler
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    loop, optimizer = resolved["loop"], resolved["optimizer"]
    updates, microbatch = int(resolved["budget"]["updates"]), int(loop["microbatch"])
    accumulation = int(loop["accumulation"])
    seed_everything(int(resolved["seed"]))  # as the campaign does before building the model
    task = build_task(task_reference, resolved)
    model = task.model()
    by_id = {str(e["id"]): e for e in task.splits()["train"]}
    rows = update_order(task_reference, resolved, 1, updates)
    examples = [by_id[i] for row in rows for chunk in row["microbatches"] for i in chunk]

    class InOrder(Dataset):
        def __len__(self) -> int:
            return len(examples)

        def __getitem__(self, index: int) -> dict[str, Any]:
            return examples[index]

    sums: list[tuple[float, int]] = []
    stamps: list[float] = []

    class SameLoss(Trainer):  # the task's loss sum / the effective batch's target count
        def _get_train_sampler(self, *_: Any) -> Any:
            return SequentialSampler(self.train_dataset)

        def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            batch = {k: v for k, v in inputs.items() if k != "labels"}
            total, units = task.loss(model, batch)
            sums.append((float(total.detach()), int(units)))
            return total / num_items_in_batch

    class Stamp(TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            stamps.append(time.perf_counter())

    def collate(chunk: list[dict[str, Any]]) -> dict[str, Any]:
        batch = task.collate(chunk)
        return {**{k: v for k, v in batch.items() if isinstance(v, torch.Tensor)},
                "labels": batch[labels]}

    schedule = {"hf_cosine": "cosine", "hf_linear": "linear"}[resolved["scheduler"]["name"]]
    arguments = TrainingArguments(
        output_dir=str(folder), per_device_train_batch_size=microbatch,
        gradient_accumulation_steps=accumulation, max_steps=updates,
        learning_rate=float(optimizer["lr"]), weight_decay=float(optimizer["weight_decay"]),
        lr_scheduler_type=schedule, warmup_steps=int(resolved["scheduler"]["warmup"]),
        max_grad_norm=float(loop["clip_grad_norm"]), logging_steps=1, save_strategy="no",
        report_to=[], use_cpu=True, dataloader_num_workers=0, seed=int(resolved["seed"]),
        remove_unused_columns=False, optim="adamw_torch", disable_tqdm=True)
    trainer = SameLoss(model=model, args=arguments, train_dataset=InOrder(),
                       data_collator=collate, callbacks=[Stamp()])
    trainer.remove_callback(PrinterCallback)  # its log line per update, on stdout
    trainer.model_accepts_loss_kwargs = True  # the loss is normalised already: no / 4 more
    began = time.perf_counter()
    trainer.train()
    ended = time.perf_counter()
    norms = [float(e["grad_norm"]) for e in trainer.state.log_history if "grad_norm" in e]
    per_update = [sums[i : i + accumulation] for i in range(0, len(sums), accumulation)]
    losses = [sum(t for t, _ in update) / sum(u for _, u in update) for update in per_update]
    parameters = sum(p.numel() for p in model.parameters())
    return {"loss": losses, "grad_norm": norms, "stamps": stamps, "parameters": parameters,
            "began": began, "ended": ended}
