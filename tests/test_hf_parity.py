"""Parity with Hugging Face's own ``Trainer`` (the ``hf`` extra), held by a test.

The same tiny Llama base, the same instruction data with responses of different lengths,
the same order (the campaign's ``update_order``, fed to the Trainer sequentially), AdamW
with weight decay on the same parameters (``optimizer.decay = "no_bias_norm"``, what the
Trainer decays), warm-up then cosine in the Trainer's own convention (``hf_cosine``),
clipping, microbatch 2 x accumulation 4 over 20 updates. The loss is the task's own sum
over its targets, normalised by the effective batch's target count (the Trainer's
``num_items_in_batch``). Every update's loss agrees to 1e-6 relative and its gradient norm
to 1e-5, for full fine-tuning and for LoRA.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require

require("transformers", "hf")
require("peft", "hf")

from campaign.ledger import Ledger  # noqa: E402
from campaign.loop.engine import seed_everything  # noqa: E402
from campaign.loop.order_view import update_order  # noqa: E402
from campaign.loop.train import execute  # noqa: E402
from campaign.tasks.causal_lm.instructions import write_splits  # noqa: E402
from campaign.tasks.causal_lm.task import CausalLMTask  # noqa: E402
from tests.loop_helpers import plan_loop  # noqa: E402

TASK = "campaign.tasks.causal_lm:build"
UPDATES, MICROBATCH, ACCUMULATION, WARMUP, LR, DECAY, CLIP = 20, 2, 4, 4, 3e-3, 0.01, 1.0
TINY = {"architecture": "llama", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
        "max_position_embeddings": 64}  # fmt: skip


def _config(data: dict[str, Path], adapter: dict[str, Any]) -> dict[str, Any]:
    flat = {f"task.data.{k}": str(v) for k, v in data.items()}
    flat |= {f"task.model_config.{k}": v for k, v in TINY.items()}
    flat |= {f"task.{k}": v for k, v in {"vocab_size": 300, "max_new_tokens": 4, **adapter}.items()}
    return {**flat, "optimizer.name": "adamw", "optimizer.lr": LR,
            "optimizer.weight_decay": DECAY, "optimizer.decay": "no_bias_norm",
            "scheduler.name": "hf_cosine", "scheduler.warmup": WARMUP}  # fmt: skip


def _campaign(url: str, artifacts: Path, name: str, config: dict[str, Any]) -> tuple:
    with Ledger.open(url, create=True) as ledger:
        run_id = plan_loop(ledger, name, task=TASK, config=config,
                           hold={"budget.updates": UPDATES, "loop.microbatch": MICROBATCH,
                                 "loop.accumulation": ACCUMULATION,
                                 "loop.clip_grad_norm": CLIP},
                           validation={"every": UPDATES, "metric": "val/exact_match",
                                       "sample": 2}, stop={"loss_explosion": None})[0]  # fmt: skip
        outcome = execute(ledger, run_id, artifacts=artifacts, replay_in_subprocess=False)
        assert outcome.status == "completed", outcome
        points = ledger.metrics(name, keys=["train/loss", "train/grad_norm"])
        resolved = ledger.run(run_id).config_document
    series = {key: points[points["key"] == key].sort_values("step")["value"].tolist()
              for key in ("train/loss", "train/grad_norm")}  # fmt: skip
    return resolved, series


def _trainer(resolved: dict[str, Any], folder: Path) -> tuple[list[float], list[float]]:
    """The same run through transformers' Trainer: (loss, grad norm) per update."""
    from torch.utils.data import Dataset, SequentialSampler
    from transformers import Trainer, TrainingArguments

    seed_everything(int(resolved["seed"]))  # as the campaign does before building the model
    task = CausalLMTask(resolved)
    model = task.model()
    by_id = {str(e["id"]): e for e in task.splits()["train"]}
    rows = update_order(TASK, resolved, 1, UPDATES)
    examples = [by_id[i] for row in rows for chunk in row["microbatches"] for i in chunk]

    class InOrder(Dataset):
        def __len__(self) -> int:
            return len(examples)

        def __getitem__(self, index: int) -> dict[str, Any]:
            return examples[index]

    sums: list[tuple[float, int]] = []

    class SameLoss(Trainer):  # the task's loss sum / the effective batch's target count
        def _get_train_sampler(self, *_: Any) -> Any:
            return SequentialSampler(self.train_dataset)

        def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:  # fmt: skip
            batch = {k: v for k, v in inputs.items() if k != "labels"}
            total, units = task.loss(model, batch)
            sums.append((float(total.detach()), int(units)))
            return total / num_items_in_batch

    def collate(chunk: list[dict[str, Any]]) -> dict[str, Any]:
        batch = task.collate(chunk)
        return {"tokens": batch["tokens"], "attention_mask": batch["attention_mask"],
                "targets": batch["targets"], "labels": batch["targets"]}  # fmt: skip

    arguments = TrainingArguments(
        output_dir=str(folder), per_device_train_batch_size=MICROBATCH,
        gradient_accumulation_steps=ACCUMULATION, max_steps=UPDATES, learning_rate=LR,
        weight_decay=DECAY, lr_scheduler_type="cosine", warmup_steps=WARMUP,
        max_grad_norm=CLIP, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
        dataloader_num_workers=0, seed=int(resolved["seed"]), remove_unused_columns=False,
        optim="adamw_torch", disable_tqdm=True)  # fmt: skip
    trainer = SameLoss(model=model, args=arguments, train_dataset=InOrder(),
                       data_collator=collate)  # fmt: skip
    trainer.model_accepts_loss_kwargs = True  # the loss is normalised already: no / 4 more
    trainer.train()
    norms = [e["grad_norm"] for e in trainer.state.log_history if "grad_norm" in e]
    updates = [sums[i:i + ACCUMULATION] for i in range(0, len(sums), ACCUMULATION)]
    losses = [sum(t for t, _ in update) / sum(u for _, u in update) for update in updates]
    return losses, [float(n) for n in norms]


@pytest.mark.parametrize("adapter", [{}, {"adapter": "lora", "lora_rank": 4}],
                         ids=["full", "lora"])  # fmt: skip
def test_the_trainer_and_the_campaign_take_the_same_updates(
    sqlite_url: str, tmp_path: Path, adapter: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAMPAIGN_ARTIFACTS", str(tmp_path / "a"))  # the tokenizer's cache
    data = write_splits(tmp_path / "data", items=60)
    resolved, ours = _campaign(sqlite_url, tmp_path / "a", "parity", _config(data, adapter))
    losses, norms = _trainer(resolved, tmp_path / "hf")
    assert len(losses) == len(norms) == len(ours["train/loss"]) == UPDATES
    assert losses == pytest.approx(ours["train/loss"], rel=1e-6)
    assert norms == pytest.approx(ours["train/grad_norm"], rel=1e-5)
    assert len(set(ours["train/loss"])) > UPDATES // 2  # the series moves: not constants
