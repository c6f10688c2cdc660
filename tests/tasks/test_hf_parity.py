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

from campaign.tasks.causal_lm.instructions import write_splits  # noqa: E402
from tests.support.hf_trainer import campaign_run, parity_config, trainer_run  # noqa: E402

UPDATES = 20
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 2,
        "max_position_embeddings": 64}


@pytest.mark.parametrize("adapter", [{}, {"adapter": "lora", "lora_rank": 4}],
                         ids=["full", "lora"])
def test_the_trainer_and_the_campaign_take_the_same_updates(
    sqlite_url: str, tmp_path: Path, adapter: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAMPAIGN_ARTIFACTS", str(tmp_path / "a"))  # the tokenizer's cache
    data = write_splits(tmp_path / "data", items=60)
    config = parity_config(data, TINY, adapter)
    resolved, ours = campaign_run(sqlite_url, tmp_path / "a", "parity", config, UPDATES)
    theirs = trainer_run(resolved, tmp_path / "hf")
    losses, norms = theirs["loss"], theirs["grad_norm"]
    assert len(losses) == len(norms) == len(ours["train/loss"]) == UPDATES
    assert losses == pytest.approx(ours["train/loss"], rel=1e-6)
    assert norms == pytest.approx(ours["train/grad_norm"], rel=1e-5)
    assert len(set(ours["train/loss"])) > UPDATES // 2  # the series moves: not constants
