"""The causal-LM task sharded (``loop.strategy = "fsdp"``, two gloo ranks): full fine-tuning
and LoRA on a frozen base take the updates of one process over 50 updates of responses of
different lengths, with accumulation: loss and gradient norm to 1e-6 relative."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require

require("transformers", "hf")
require("peft", "hf")

from campaign.ledger import Ledger  # noqa: E402
from campaign.loop.train import execute  # noqa: E402
from campaign.tasks.causal_lm.instructions import write_splits  # noqa: E402
from tests.support.hf_trainer import TASK, parity_config  # noqa: E402
from tests.support.launch_helpers import run  # noqa: E402
from tests.support.loop_helpers import plan_loop  # noqa: E402

UPDATES = 50
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 64}


def plan(ledger: Ledger, name: str, config: dict[str, Any], hold: dict[str, Any]) -> str:
    flat = {k: v for k, v in config.items() if not k.startswith("loop.")}
    return plan_loop(ledger, name, task=TASK, config=flat,
                     hold={"budget.updates": UPDATES, "loop.microbatch": 2,
                           "loop.clip_grad_norm": 1.0, **hold},
                     validation={"every": 25, "metric": "val/exact_match", "sample": 2},
                     stop={"loss_explosion": None})[0]


@pytest.mark.slow
@pytest.mark.parametrize("adapter", [{}, {"adapter": "lora", "lora_rank": 4}],
                         ids=["full", "lora"])
def test_the_sharded_causal_lm_takes_one_process_updates(
    sqlite_url: str, tmp_path: Path, adapter: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAMPAIGN_ARTIFACTS", str(tmp_path / "a"))  # the tokenizer's cache
    config = parity_config(write_splits(tmp_path / "data", items=60), TINY, adapter)
    with Ledger.open(sqlite_url, create=True) as ledger:
        single = plan(ledger, "single", config, {"loop.accumulation": 4})
        assert execute(ledger, single, artifacts=tmp_path / "a",
                       replay_in_subprocess=False).status == "completed"
        sharded = plan(ledger, "sharded", config, {"loop.accumulation": 2, "loop.replicas": 2,
                                                  "loop.strategy": "fsdp"})
    done = run(sqlite_url, "worker", "sharded", "--artifacts", str(tmp_path / "a"),
               "--skip-pilot", "--reason", "sharded parity", "--no-replay-check")
    assert done.returncode == 0, done.stderr[-3000:]
    with Ledger.open(sqlite_url) as ledger:
        assert ledger.run(sharded).status == "completed"
        points = ledger.metrics(runs=[single, sharded], keys=["train/loss", "train/grad_norm"])
        events = ledger.events("sharded")
    table = points.pivot_table(index=["key", "step"], columns="run_id", values="value")
    assert len(table) == 2 * UPDATES
    mine, theirs = table[sharded], table[single]
    assert mine.tolist() == pytest.approx(theirs.tolist(), rel=1e-6)
    assert table.loc["train/loss", single].nunique() > UPDATES // 2  # the series moves
    assert events[events["kind"] == "sharding"]["detail"].tolist() == [
        "FSDP2 over 2 ranks, 2 units: the model's _no_split_modules (LlamaDecoderLayer)"]
