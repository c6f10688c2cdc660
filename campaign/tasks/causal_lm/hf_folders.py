"""A Hugging Face task's run (a causal LM, a sequence classifier) as the folders Hugging
Face tools load (``campaign export``).

- a full fine-tune: ``AutoModelForCausalLM.from_pretrained(DIR)`` (the classifier's:
  ``AutoModelForSequenceClassification``) (config.json, model.safetensors,
  generation_config.json) with the run's tokenizer beside it;
- a LoRA run: a PEFT adapter folder, ``PeftModel.from_pretrained(base, DIR)``
  (adapter_config.json, adapter_model.safetensors) with the tokenizer; a base built from a
  config (not a local folder) is saved beside it in ``DIR/base``, and the adapter's
  ``base_model_name_or_path`` names where the base is (``DIR/base`` or the base folder);
- a LoRA run with ``--merge``: the adapter merged into the base, a plain model folder (its
  logits equal the adapter's up to the rounding of ``W + BA`` against ``xW + (xA)B``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def export_pretrained(task: Any, model: torch.nn.Module, staging: Path, final: Path,
                      merge: bool) -> str:
    """Write the run's model into ``staging`` (renamed to ``final`` once whole); returns the
    folder's format in words."""
    tokenizer = task.tokenizer
    lora = task.settings["adapter"] == "lora"
    if merge and not lora:
        raise ValueError("--merge: this run trained the whole model (no adapter to merge)")
    if not lora or merge:
        whole = model.merge_and_unload() if merge else model
        whole.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        return "transformers (LoRA merged into the base)" if merge else "transformers"
    base_path = task.settings["path"]
    if not base_path:  # built from a config and a seed: the base itself travels with it
        base = task.base_model()
        base.save_pretrained(staging / "base")
        tokenizer.save_pretrained(staging / "base")
        base_path = final / "base"
    for config in model.peft_config.values():
        config.base_model_name_or_path = str(base_path)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    return "peft adapter" + (" (base in base/)" if not task.settings["path"] else "")
