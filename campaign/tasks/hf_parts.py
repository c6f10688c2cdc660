"""What the Hugging Face tasks (``causal_lm``, ``hf_classify``) share beyond their data and
loss: the frozen base's identity, LoRA's facts, the model's own activation checkpointing
and ``campaign export`` to folders transformers and PEFT load. A task using it sets
``settings`` (:func:`campaign.tasks.causal_lm.model.model_settings`), ``options``,
``config``, ``base_seed``, ``tokenizer`` and ``tokenizer_identity``, and builds its base
with ``base_model()``."""

from __future__ import annotations

from typing import Any

import torch

from campaign.tasks.causal_lm import model as lm


class HFModelParts:
    settings: dict[str, Any]
    options: dict[str, Any]
    config: dict[str, Any]
    base_seed: int
    tokenizer_identity: str

    @property
    def tokenizer(self) -> Any:
        raise NotImplementedError

    peft_task_type = "CAUSAL_LM"

    def base_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def model(self) -> torch.nn.Module:
        """The base, checked against the tokenizer, wrapped with LoRA when asked."""
        base = self.base_model()
        rows = base.get_input_embeddings().num_embeddings
        if len(self.tokenizer) > rows:  # an index error deep in a run otherwise
            raise ValueError(f"task.tokenizer_path: the tokenizer has {len(self.tokenizer)} "
                             f"tokens, the model's embedding {rows} rows")
        if self.settings["adapter"] == "lora":
            return lm.with_adapter(base, self.options, task_type=self.peft_task_type)
        return base

    def export_pretrained(self, model: torch.nn.Module, staging: Any, final: Any,
                          merge: bool) -> str:
        """``campaign export``: folders transformers and PEFT load (see its module)."""
        from campaign.tasks.causal_lm.hf_folders import export_pretrained

        return export_pretrained(self, model, staging, final, merge)

    @property
    def trainable_only(self) -> bool:
        """Checkpoints and the final artifact hold only the adapter (the loop reads this)."""
        return self.settings["adapter"] == "lora"

    def base_identity(self) -> dict[str, Any]:
        """What the frozen base is, recorded with its hash (the loop adds the hash)."""
        path = self.settings["path"]
        source = ({"model_path": str(path), "config_sha256": lm.folder_config_hash(path)}
                  if path else {"model_config": self.settings["config"],
                                "base_seed": self.base_seed})
        _ = self.tokenizer  # the identity below is set when the tokenizer is loaded
        return {"base": source, "tokenizer": self.tokenizer_identity,
                "adapter": self.settings["adapter"]}

    def adapter_facts(self) -> dict[str, Any]:
        """What the ``base_model`` event records about the adapter beside the base: its
        settings as PEFT took them and where its initialisation came from."""
        keys = ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets",
                "lora_modules_to_save", "lora_use_rslora", "lora_init", "lora_bias")
        return {"lora": {k: self.options.get(k) for k in keys if k in self.options},
                "adapter_init": f"torch's global generator, seeded with the run's seed "
                                f"{self.config.get('seed')} before the model is built"}

    def enable_activation_checkpointing(self, model: torch.nn.Module) -> None:
        """``loop.activation_checkpointing``: the model's own gradient checkpointing."""
        lm.enable_checkpointing(model)
