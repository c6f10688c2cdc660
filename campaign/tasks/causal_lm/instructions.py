"""The tiny instruction data set the example campaign and ``campaign demo --llm`` train on.

Word-order instructions over a small vocabulary, in four templates: reverse
the words, sort them, name the first one, count them. Each content item (a
tuple of words) is one ``group``: its renderings by every template go to the
same split, so no validation answer can be read off a training example that
shares its words. Made by a seeded generator: nothing is downloaded, and the
files are the same on every machine.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "ocean", "maple",
         "ember", "frost", "grape", "honey", "ivory", "jelly", "koala")
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six")
TEMPLATES: dict[str, tuple[str, Callable[[list[str]], str]]] = {
    "reverse": ("reverse the words: {words}", lambda w: " ".join(reversed(w))),
    "sort": ("sort the words: {words}", lambda w: " ".join(sorted(w))),
    "first": ("first word of: {words}", lambda w: w[0]),
    "count": ("count the words: {words}", lambda w: NUMBERS[len(w)]),
}
SHARES = {"train": 0.8, "val": 0.1, "test": 0.1}


def make_splits(items: int = 400, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """``items`` distinct word tuples (3 or 4 words), each rendered by every template,
    split by item: train 80%, val 10%, test 10%."""
    rng = random.Random(seed)
    chosen: list[tuple[str, ...]] = []
    seen: set[tuple[str, ...]] = set()
    while len(chosen) < items:
        words = tuple(rng.sample(WORDS, rng.choice((3, 4))))
        if words not in seen:
            seen.add(words)
            chosen.append(words)
    cut_train = int(items * SHARES["train"])
    cut_val = cut_train + int(items * SHARES["val"])
    ranges = {"train": chosen[:cut_train], "val": chosen[cut_train:cut_val],
              "test": chosen[cut_val:]}
    splits: dict[str, list[dict[str, Any]]] = {}
    for split, words_list in ranges.items():
        rows = []
        for number, words in enumerate(words_list):
            group = f"{split}-{number:04d}"
            for name, (prompt, answer) in TEMPLATES.items():
                rows.append({"id": f"{group}-{name}", "group": group,
                             "prompt": prompt.format(words=" ".join(words)) + "\n",
                             "response": answer(list(words))})
        splits[split] = rows
    return splits


def write_splits(folder: Path, items: int = 400, seed: int = 0) -> dict[str, Path]:
    """Write ``train.jsonl``, ``val.jsonl`` and ``test.jsonl`` into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, rows in make_splits(items, seed).items():
        path = folder / f"{split}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        paths[split] = path
    return paths
