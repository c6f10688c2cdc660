"""Per-update time of a causal-LM run: the campaign's loop against Hugging Face's Trainer.

    python benchmarks/hf_trainer.py [--updates 40] [--rounds 3] [--models small,large]

The same base, data, order, AdamW, warm-up + cosine (the Trainer's convention), clipping,
microbatch 2 x accumulation 4, as in the parity test (``tests/support/hf_trainer.py`` runs both).
Interleaved round by round in this one process, CPU, 2 threads. Per-update time is the
median update-to-update gap after the first two updates: for the campaign from the wall
times of its ``train/loss`` points, for the Trainer from its ``on_step_end``. Both log
every update (the Trainer with ``logging_steps=1``). Prints each median and the paired
ratio campaign / Trainer (the median of per-round ratios); then the whole run, split into
its set-up (to the end of the first update: the model, the data, the optimizer's state),
its updates, and its ending (after the last update: the campaign's last validation,
checkpoint, export and replay check; the Trainer has nothing there).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from campaign.tasks.causal_lm.instructions import write_splits
from tests.support.hf_trainer import campaign_run, parity_config, trainer_run

MODELS = {  # 121k and 3.3M parameters with the 300-token vocabulary, as in the issue
    "small": {"max_position_embeddings": 128, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4},
    "large": {"max_position_embeddings": 128, "hidden_size": 256, "intermediate_size": 688,
              "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4},
}


KINDS = {"campaign": "campaign loop, in process", "trainer": "transformers.Trainer",
         "command": "campaign run RUN_ID"}


def per_update(stamps: list[float]) -> tuple[float, float]:
    """(median, mean) gap after the first two updates (the optimizer's state is allocated by
    then). The median is the steady update; the mean also carries what only some updates pay
    (the campaign's phase probes and metric flushes, the Trainer's own periodic work)."""
    gaps = [b - a for a, b in itertools.pairwise(stamps[2:])]
    return statistics.median(gaps), statistics.fmean(gaps)


def one(key: str, folder: Path, name: str, spec: dict[str, Any], resolved: dict[str, Any]
        ) -> dict[str, Any]:
    """One run by approach ``key``, in its own new ledger."""
    if key == "trainer":
        return trainer_run(resolved, folder / f"hf-{name}")
    url = f"sqlite:///{folder / f'{name}-{key}.db'}"
    updates = int(resolved["budget"]["updates"])
    return campaign_run(url, folder / "artifacts", name, spec, updates, key == "command")[1]


def split(run: dict[str, Any]) -> tuple[float, float, float]:
    """(set-up, updates, ending) seconds of one run, from its stamps and its bounds."""
    stamps = run["stamps"]
    return stamps[0] - run["began"], stamps[-1] - stamps[0], run["ended"] - stamps[-1]


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
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in KINDS}
        whole: dict[str, list[tuple[float, float, float]]] = {k: [] for k in KINDS}
        parameters = 0
        spec = parity_config(data, MODELS[model],
                             {"adapter": "lora", "lora_rank": 8} if adapter else {})
        warm = f"{model}-{'lora' if adapter else 'full'}"  # trains the tokenizer, fills caches
        resolved, _ = campaign_run(f"sqlite:///{folder / (warm + '.db')}", folder / "artifacts",
                                   warm, spec, 3)
        resolved["budget"]["updates"] = args.updates
        for index in range(args.rounds):  # each approach once a round, in a rotating order
            name = f"{warm}-{index}"
            order = list(KINDS)[index % 3 :] + list(KINDS)[: index % 3]
            for key in order:
                run = one(key, folder, name, spec, resolved)
                times[key].append(per_update(run["stamps"]))
                whole[key].append(split(run))
                parameters = run.get("parameters", parameters)
        kind = "LoRA r8" if adapter else "full fine-tuning"
        print(f"\n{model}: {parameters:,} parameters, {kind}")
        theirs_ = times["trainer"]
        for which, label in ((0, "median"), (1, "mean")):
            t = statistics.median(r[which] for r in theirs_)
            print(f"  {label} per update: Trainer {t * 1e3:7.1f} ms")
            for key in ("campaign", "command"):
                ours_ = [r[which] for r in times[key]]
                ratios = [a / b[which] for a, b in zip(ours_, theirs_, strict=True)]
                c = statistics.median(ours_)
                print(f"    {KINDS[key]:<28} {c * 1e3:7.1f} ms: {statistics.median(ratios):4.2f}x "
                      f"paired ({(c - t) * 1e3:+.1f} ms)")
        parts = {k: [statistics.median(r[i] for r in whole[k]) for i in range(3)] for k in whole}
        print("  whole run: set-up (to the first update's end) + updates + ending")
        for key, (setup, updates, ending) in parts.items():
            total = setup + updates + ending
            print(f"    {KINDS[key]:<28} {setup:6.2f} s + {updates:6.2f} s + {ending:6.2f} s "
                  f"= {total:6.2f} s ({total / args.updates * 1e3:.1f} ms/update)")


if __name__ == "__main__":
    main()
