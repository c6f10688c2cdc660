"""Small text classification data made here (nothing downloaded): sentences of a few words
whose class is the mood of most of their words, in JSONL, CSV or Parquet."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd

WORDS = {"negative": ("dull", "broken", "slow", "awful", "cold", "late"),
         "neutral": ("table", "paper", "street", "window", "number", "river"),
         "positive": ("bright", "kind", "quick", "lovely", "warm", "fresh")}


def rows(count: int, seed: int) -> list[dict[str, object]]:
    draw = random.Random(seed)
    names = sorted(WORDS)
    made = []
    for index in range(count):
        name = names[index % len(names)]
        words = [draw.choice(WORDS[name]) for _ in range(draw.randint(3, 7))]
        words.insert(draw.randrange(len(words)), draw.choice(WORDS[draw.choice(names)]))
        made.append({"id": f"s{seed}-{index}", "text": " ".join(words), "label": name,
                     "group": f"g{seed}-{index}"})
    return made


def write(path: Path, examples: list[dict[str, object]]) -> Path:
    """``examples`` as the file ``path``'s suffix says."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(e) + "\n" for e in examples))
    elif path.suffix == ".csv":
        pd.DataFrame(examples).to_csv(path, index=False)
    else:
        pd.DataFrame(examples).to_parquet(path, index=False)
    return path


def write_splits(folder: Path, items: int = 90, train: str = ".jsonl",
                 val: str = ".csv") -> dict[str, Path]:
    """A train and a val file of ``items`` and ``items // 3`` examples."""
    return {"train": write(folder / f"train{train}", rows(items, 1)),
            "val": write(folder / f"val{val}", rows(max(6, items // 3), 2))}
