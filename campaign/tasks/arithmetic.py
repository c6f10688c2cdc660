"""Instruction -> answer generation: "17+5=" -> "22", character level, a tiny causal transformer.

The prompt is in the input but masked out of the loss: only the answer and
its end token are predicted targets. Lengths vary (1- to N-digit operands)
and batches are right-padded; the loss is the *sum* over answer tokens and
the units are the number of answer tokens, so the loop's normalisation over
the whole effective batch is exact however the examples are split.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from campaign.tasks.keys import ArithmeticKeys
from campaign.tasks.sequences import IGNORE, next_token_pairs

TASK_KEYS = ArithmeticKeys  # its task.* keys: plan refuses any other

PAD, BOS, EOS = 0, 1, 2
CHARS = "0123456789+="
VOCAB = ("<pad>", "<bos>", "<eos>", *CHARS)
TOKEN = {c: i + 3 for i, c in enumerate(CHARS)}


class ArithmeticTask:
    metrics = ("accuracy",)  # what score() returns: plan checks the spec's metric against it
    random_examples = False  # reading and collating draw nothing: the loader seeds nothing

    def __init__(self, config: dict[str, Any]) -> None:
        options = config.get("task", {})
        self.digits = int(options.get("digits", 2))
        self.train_size = int(options.get("train_size", 2000))
        self.val_size = int(options.get("val_size", 200))
        self.split_seed = int(options.get("split_seed", 0))
        self.width = int(options.get("width", 64))
        self.layers = int(options.get("layers", 2))
        self.max_length = config.get("loop", {}).get("max_length")
        self.longest = 1 + 2 * self.digits + 2 + (self.digits + 1) + 1
        self._splits: dict[str, list[dict[str, Any]]] | None = None

    def model(self) -> nn.Module:
        return TinyTransformer(len(VOCAB), self.width, self.layers, self.longest)

    def shard_units(self, model: nn.Module) -> list[nn.Module]:
        """The repeated blocks a sharded run (``loop.strategy = "fsdp"``) shards one by one."""
        return list(model.blocks)

    def splits(self) -> dict[str, Sequence[dict[str, Any]]]:
        if self._splits is None:
            rng = np.random.default_rng(self.split_seed)
            high = 10**self.digits
            seen: set[tuple[int, int]] = set()
            problems = []
            while len(problems) < self.train_size + self.val_size:
                a, b = (int(v) for v in rng.integers(0, high, size=2))
                if (a, b) not in seen:  # no problem in two splits
                    seen.add((a, b))
                    problems.append((a, b))
            examples = [self._example(a, b) for a, b in problems]
            self._splits = {
                "train": examples[: self.train_size],
                "val": examples[self.train_size :],
            }
        return self._splits

    @staticmethod
    def _example(a: int, b: int) -> dict[str, Any]:
        prompt, answer = f"{a}+{b}=", str(a + b)
        # "target": what predict() must report as this example's target (the label gate).
        return {"id": f"add-{a}-{b}", "group": f"{a}+{b}", "prompt": prompt, "answer": answer,
                "target": answer}

    def encode(self, example: dict[str, Any]) -> tuple[list[int], list[int], bool]:
        """(input tokens, target tokens with IGNORE on the prompt, target cut by max_length)."""
        prompt = [BOS, *(TOKEN[c] for c in example["prompt"])]
        answer = [*(TOKEN[c] for c in example["answer"]), EOS]
        return next_token_pairs(prompt, answer, self.max_length)

    def collate(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        encoded = [self.encode(e) for e in examples]
        longest = max(len(inputs) for inputs, _, _ in encoded)
        tokens = torch.full((len(examples), longest), PAD, dtype=torch.long)
        targets = torch.full((len(examples), longest), IGNORE, dtype=torch.long)
        for row, (inputs, target, _) in enumerate(encoded):
            tokens[row, : len(inputs)] = torch.tensor(inputs)
            targets[row, : len(target)] = torch.tensor(target)
        return {
            "tokens": tokens,
            "targets": targets,
            "lengths": torch.tensor([len(i) for i, _, _ in encoded]),
            # tokens of BOS + prompt: targets before position prompt_length - 1 are prompt
            "prompt_lengths": torch.tensor([1 + len(e["prompt"]) for e in examples]),
            "target_cut": torch.tensor([cut for _, _, cut in encoded]),
            "ids": [e["id"] for e in examples],
        }

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        logits = model(batch["tokens"])
        targets = batch["targets"]
        total = nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            targets.reshape(-1),
            ignore_index=IGNORE,
            reduction="sum",
        )
        return total, (targets != IGNORE).sum()

    @torch.no_grad()
    def predict(self, model: nn.Module, batch: dict[str, Any]) -> list[dict[str, Any]]:
        records = []
        for row, example_id in enumerate(batch["ids"]):
            length = int(batch["lengths"][row])
            tokens = batch["tokens"][row, :length].tolist()
            targets = batch["targets"][row, :length].tolist()
            prompt_end = next(i for i, t in enumerate(targets) if t != IGNORE) + 1
            generated = greedy(model, tokens[:prompt_end], self.digits + 2)
            answer = "".join(VOCAB[t] for t in targets if t not in (IGNORE, EOS))
            records.append({"id": example_id, "prediction": generated, "target": answer})
        return records

    def score(self, records: Sequence[dict[str, Any]]) -> dict[str, float]:
        exact = sum(r["prediction"] == r["target"] for r in records)
        return {"accuracy": exact / max(1, len(records))}

    def describe(self, example: dict[str, Any]) -> dict[str, str]:
        inputs, targets, cut = self.encode(example)
        shown = "".join(VOCAB[t] if t > 2 else "^" for t in inputs)
        mask = "".join("." if t == IGNORE else "L" for t in targets)
        return {
            "input": shown,
            "target": example["answer"],
            "mask": f"{mask}  (L: position whose next token is in the loss)",
            "length": str(len(inputs)),
            "truncated": "target cut" if cut else "no",
        }

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids as characters (``^`` for PAD, BOS, EOS): what ``inspect`` shows."""
        return "".join(VOCAB[t] if t > 2 else "^" for t in ids)

    def control_inputs(self) -> Sequence[dict[str, Any]]:
        return self.splits()["val"][:4]


def greedy(model: nn.Module, prompt: list[int], steps: int) -> str:
    tokens = list(prompt)
    out = []
    for _ in range(steps):
        logits = model(torch.tensor([tokens]))
        nxt = int(logits[0, -1].argmax())
        if nxt == EOS or len(tokens) >= model.max_positions:
            break
        out.append(VOCAB[nxt] if nxt > 2 else "?")
        tokens.append(nxt)
    return "".join(out)


class TinyTransformer(nn.Module):
    """Token + position embeddings, causal self-attention blocks (``blocks``), a linear head."""

    def __init__(self, vocab: int, width: int, layers: int, max_positions: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(max_positions, width)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                width, nhead=4, dim_feedforward=2 * width, dropout=0.0, batch_first=True
            )
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.embed(tokens) + self.position(torch.arange(length, device=tokens.device))
        # Right padding and a causal mask: real positions never see the pads.
        mask = torch.triu(
            torch.full((length, length), float("-inf"), device=tokens.device, dtype=x.dtype),
            diagonal=1,
        )
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


def build(config: dict[str, Any]) -> ArithmeticTask:
    return ArithmeticTask(config)
