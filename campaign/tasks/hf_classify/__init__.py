"""``campaign.tasks.hf_classify:build``: text classification with a Hugging Face
``AutoModelForSequenceClassification`` (extra ``campaign[hf]``: transformers, tokenizers,
peft). Nothing heavy is imported until the task is built."""

from __future__ import annotations

from typing import Any

from campaign.tasks.keys import ClassifyKeys

TASK_KEYS = ClassifyKeys  # its task.* keys: plan refuses any other

# Imported once by a worker that forks its runs (transformers takes seconds per process).
PRELOAD = ("transformers", "tokenizers", "peft", "campaign.tasks.hf_classify.classify_task")


def build(config: dict[str, Any]) -> Any:
    from campaign.tasks.causal_lm import missing_libraries

    missing_libraries(config, "hf_classify")
    from campaign.tasks.hf_classify.classify_task import HFClassifyTask

    return HFClassifyTask(config)
