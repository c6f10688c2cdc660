"""The memory projection of `campaign size --model-config` against a real measurement.

Pilots-style measurement of a small Llama-style config (what `campaign pilot` records in its
forward phase: saved activations, apart inside the blocks), projected to a larger config of
the same family; then the larger config is built for real on this machine's CPU and measured
the same way, and its optimizer state counted after one real AdamW step. Prints both and the
ratios: parameters and optimizer state must be exact, activations within 2x.

    python benchmarks/llm_memory.py [--adapter none|lora] [--hidden 512 --layers 8 ...]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from campaign.pilot.activations import measure
from campaign.tasks.causal_lm import memory_projection as projection
from campaign.tasks.causal_lm.instruction_task import CausalLMTask
from campaign.tasks.causal_lm.instructions import write_splits

SMALL = {"architecture": "llama", "hidden_size": 128, "intermediate_size": 344,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
         "max_position_embeddings": 64}


def measured(task: CausalLMTask) -> tuple[dict[str, Any], int, int]:
    """(saved activations of the longest microbatch, parameters, optimizer state bytes)."""
    torch.manual_seed(0)
    model = task.model()
    train = sorted(task.splits()["train"], key=lambda e: -len(e["prompt"] + e["response"]))
    batch = task.collate(train[:8])
    found = measure(model, batch, lambda: task.loss(model, batch))
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)
    total, units = task.loss(model, batch)
    (total / units).backward()
    optimizer.step()
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values()
                for t in s.values() if isinstance(t, torch.Tensor))
    return found, sum(p.numel() for p in model.parameters()), state


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--adapter", default="none", choices=("none", "lora"))
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--intermediate", type=int, default=1376)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    os.environ["CAMPAIGN_ARTIFACTS"] = str(folder)
    data = {k: str(v) for k, v in write_splits(folder / "data").items()}
    lora = {"adapter": "lora", "lora_rank": 8, "lora_targets": ["q_proj", "v_proj", "down_proj"]}
    options = {"data": data, "vocab_size": 384, **(lora if args.adapter == "lora" else {})}
    target = {"hidden_size": args.hidden, "intermediate_size": args.intermediate,
              "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
              "num_key_value_heads": args.heads}
    run_config = {"task": {**options, "model_config": SMALL},
                  "optimizer": {"name": "adamw"}, "loop": {"max_length": 48}}
    small = CausalLMTask(run_config)
    found, _, _ = measured(small)
    rows = {r["item"]: r for r in projection.project(run_config, found, target)}
    big = CausalLMTask({**run_config, "task": {**options, "model_config": {**SMALL, **target}}})
    real, parameters, state = measured(big)
    print(f"adapter {args.adapter}: piloted {SMALL['hidden_size']}x{SMALL['num_hidden_layers']}"
          f" -> target {args.hidden}x{args.layers}")
    print(f"{'item':<18}{'projected':>14}{'measured':>14}{'ratio':>8}")
    for item, value in (("parameters", parameters), ("optimizer_bytes", state),
                        ("activation_bytes", real["saved_bytes"])):
        estimate = rows[item]["target_estimate"]
        print(f"{item:<18}{estimate:>14,}{value:>14,}{estimate / value:>8.3f}")


if __name__ == "__main__":
    main()
