"""``campaign.tasks.causal_lm:build``: instruction fine-tuning of a Hugging Face causal LM
(extra ``campaign[hf]``: transformers, tokenizers, peft). Nothing heavy is imported until
the task is built."""

from __future__ import annotations

from typing import Any

from campaign.tasks.keys import CausalLMKeys

TASK_KEYS = CausalLMKeys  # its task.* keys: plan refuses any other

# Imported once by a worker that forks its runs (transformers takes seconds per process).
PRELOAD = ("transformers", "tokenizers", "peft", "campaign.tasks.causal_lm.instruction_task")


def missing_libraries(config: dict[str, Any], task: str) -> None:
    """An ImportError naming the ``hf`` extra when a library the task needs is not installed
    (found without importing them: transformers takes seconds)."""
    import importlib.util

    needed = ["transformers", "tokenizers"]
    if (config.get("task") or {}).get("adapter") == "lora":
        needed.append("peft")
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"the {task} task needs {', '.join(missing)}: "
                          "pip install 'campaign[hf]'")


def build(config: dict[str, Any]) -> Any:
    missing_libraries(config, "causal_lm")
    from campaign.tasks.causal_lm.instruction_task import CausalLMTask

    return CausalLMTask(config)
