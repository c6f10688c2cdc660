"""Per-update time of a causal-LM run: the campaign's loop against Hugging Face's Trainer.

    python benchmarks/hf_trainer.py [--updates 40] [--rounds 3] [--models small,large]

The same base, data, order, AdamW, warm-up + cosine (the Trainer's convention), clipping,
microbatch 2 x accumulation 4, as in the parity test (``tests/hf_trainer.py`` runs both).
Interleaved round by round in this one process, CPU, 2 threads. Per-update time is the
median update-to-update gap after the first two updates: for the campaign from the wall
times of its ``train/loss`` points, for the Trainer from its ``on_step_end``. Both log
every update (the Trainer with ``logging_steps=1``). Prints each median and the paired
ratio campaign / Trainer (the median of per-round ratios).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from campaign.tasks.causal_lm.instructions import write_splits
from tests.hf_trainer import campaign_run, trainer_run

MODELS = {  # 133k and 3.07M parameters with the 300-token vocabulary, as in the issue
    "small": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 4},
    "large": {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 4},
}  # fmt: skip


def config(data: dict[str, Path], model: str, adapter: bool) -> dict[str, object]:
    flat: dict[str, object] = {f"task.data.{k}": str(v) for k, v in data.items()}
    shape = {"architecture": "llama", "max_position_embeddings": 128, **MODELS[model]}
    flat |= {f"task.model_config.{k}": v for k, v in shape.items()}
    flat |= {"task.vocab_size": 300, "task.max_new_tokens": 4}
    if adapter:
        flat |= {"task.adapter": "lora", "task.lora_rank": 8}
    return {**flat, "optimizer.name": "adamw", "optimizer.lr": 3e-3,
            "optimizer.weight_decay": 0.01, "optimizer.decay": "no_bias_norm",
            "scheduler.name": "hf_cosine", "scheduler.warmup": 4, "loop.microbatch": 2,
            "loop.accumulation": 4, "loop.clip_grad_norm": 1.0}  # fmt: skip


def per_update(stamps: list[float]) -> tuple[float, float]:
    """(median, mean) gap after the first two updates (the optimizer's state is allocated by
    then). The median is the steady update; the mean also carries what only some updates pay
    (the campaign's phase probes and metric flushes, the Trainer's own periodic work)."""
    gaps = [b - a for a, b in itertools.pairwise(stamps[2:])]
    return statistics.median(gaps), statistics.fmean(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="small,large")
    parser.add_argument("--lora", action="store_true", help="a LoRA adapter (rank 8) too")
    args = parser.parse_args()
    torch.set_num_threads(2)
    folder = Path(tempfile.mkdtemp(prefix="campaign-hf-trainer-"))
    os.environ["CAMPAIGN_ARTIFACTS"] = str(folder / "artifacts")  # the tokenizer's cache
    data = write_splits(folder / "data", items=max(60, args.updates * 8 // 3))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.updates} "
          f"updates of microbatch 2 x accumulation 4, {args.rounds} interleaved rounds")
    kinds = [(m, False) for m in args.models.split(",")]
    kinds += [(m, True) for m in args.models.split(",")] if args.lora else []
    for model, adapter in kinds:
        times: dict[str, list[tuple[float, float]]] = {"campaign": [], "trainer": []}
        parameters = 0
        for index in range(args.rounds):
            name = f"{model}-{'lora' if adapter else 'full'}-{index}"
            url = f"sqlite:///{folder / (name + '.db')}"
            resolved, ours = campaign_run(url, folder / "artifacts", name,
                                          config(data, model, adapter), args.updates)  # fmt: skip
            theirs = trainer_run(resolved, folder / f"hf-{name}")
            parameters = theirs["parameters"]
            times["campaign"].append(per_update(ours["stamps"]))
            times["trainer"].append(per_update(theirs["stamps"]))
        kind = "LoRA r8" if adapter else "full fine-tuning"
        print(f"\n{model}: {parameters:,} parameters, {kind}")
        for which, label in ((0, "median"), (1, "mean")):
            ours_, theirs_ = ([r[which] for r in times[k]] for k in ("campaign", "trainer"))
            ratios = [a / b for a, b in zip(ours_, theirs_, strict=True)]
            c, t = statistics.median(ours_), statistics.median(theirs_)
            print(f"  {label:<6} campaign {c * 1e3:7.1f} ms/update, Trainer {t * 1e3:7.1f}: "
                  f"{statistics.median(ratios):4.2f}x paired ({(c - t) * 1e3:+.1f} ms)")


if __name__ == "__main__":
    main()
