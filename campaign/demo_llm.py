"""``campaign demo --llm``: the instruction fine-tuning campaign of ``examples/llm-lora.toml``.

Full fine-tuning of a ~1M-parameter Llama-style model against LoRA adapters at
ranks 4 and 16, on the word-order instructions the project makes
(:mod:`campaign.tasks.causal_lm.instructions`, written into the demo folder),
with a byte-level BPE tokenizer trained on them at first use. Three seeds per
variant, so every conclusion has its interval; a few minutes on CPU.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

NAME = "llm-lora"
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SPEC: dict[str, Any] = {
    "campaign": {"name": NAME, "task": "campaign.tasks.causal_lm:build",
                 "question": "Do LoRA adapters at rank 4 or 16 reach full fine-tuning's exact "
                             "match on the word-order instructions after 300 updates?"},
    "hold": {"loop.microbatch": 8, "loop.accumulation": 2, "loop.replicas": 1,
             "loop.precision": "fp32", "loop.max_length": 48, "budget.updates": 300,
             "task.vocab_size": 384, "task.model_config.architecture": "llama",
             "task.model_config.hidden_size": 128, "task.model_config.intermediate_size": 344,
             "task.model_config.num_hidden_layers": 4,
             "task.model_config.num_attention_heads": 4,
             "task.model_config.num_key_value_heads": 4,
             "task.model_config.max_position_embeddings": 64, "task.max_new_tokens": 12},
    "config": {"optimizer.name": "adamw", "optimizer.lr": 2e-3, "optimizer.weight_decay": 0.0,
               "scheduler.name": "cosine", "scheduler.warmup": 20, "task.adapter": "none"},
    "validation": {"every": 100, "metric": "val/exact_match", "mode": "max", "sample": 48},
    "pilot": {"overfit_factor": 1.5, "overfit_lr": 3e-3},
    "stop": {"loss_explosion": 4.0, "wall_time": "30m"},
    "grid": {"seeds": [0, 1, 2], "control": "full", "variants": [
        {"name": "full", "set": {"task.adapter": "none"}},
        {"name": "lora-r4", "set": {"task.adapter": "lora", "task.lora_rank": 4,
                                    "task.lora_alpha": 8, "optimizer.lr": 5e-3,
                                    "task.lora_targets": ALL_LINEAR}},
        {"name": "lora-r16", "set": {"task.adapter": "lora", "task.lora_rank": 16,
                                     "task.lora_alpha": 32, "optimizer.lr": 5e-3,
                                     "task.lora_targets": ALL_LINEAR}},
    ]},
}


def spec(folder: Path, updates: int = 300, seeds: int = 3) -> dict[str, Any]:
    """The campaign with its data written into ``folder/instructions`` (absolute paths)."""
    from campaign.tasks.causal_lm.instructions import write_splits

    document = copy.deepcopy(SPEC)
    for split, path in write_splits(folder / "instructions").items():
        document["hold"][f"task.data.{split}"] = str(path.resolve())
    document["hold"]["budget.updates"] = updates
    document["campaign"]["question"] = document["campaign"]["question"].replace(
        "300 updates", f"{updates} updates")
    # three validations in a real demo; a quick look (under 60 updates) validates at its end
    document["validation"]["every"] = min(100, updates // 3) if updates >= 60 else updates
    document["grid"]["seeds"] = list(range(seeds))
    return document
