"""Instruction fine-tuning of a causal language model: the prompt in the input, out of the loss.

Every example is ``bos + prompt + response + eos``, tokenised as two parts (the
prompt's tokens and the response's, so the boundary is exact), right-padded.
The model predicts token ``p + 1`` at position ``p``; the targets of the
prompt's positions are -100 (not in the loss), so only the response and its
end token are learned. ``loop.max_length`` cuts the input; an example whose
response loses tokens to the cut is flagged (``target_cut``) and the data
gate refuses it unless ``loop.allow_target_truncation``. The loss is the *sum*
of the response tokens' cross-entropy and the units their count, so the
loop's normalisation over the whole effective batch is exact.

Predictions are greedy generations (no sampling) of at most
``task.max_new_tokens`` tokens, scored by exact match (``val/exact_match``);
the records keep the generated token ids, so a replay compares token by token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from campaign.tasks.causal_lm import model as lm
from campaign.tasks.causal_lm.pairs_file import data_paths, read_pairs
from campaign.tasks.causal_lm.tokenizer import load_tokenizer
from campaign.tasks.hf_parts import HFModelParts
from campaign.tasks.sequences import IGNORE, next_token_pairs


class CausalLMTask(HFModelParts):
    """The task contract (docs/tasks.md) for instruction -> response pairs."""

    metrics = ("exact_match",)  # what score() returns: plan checks the spec's metric against it
    random_examples = False  # reading and collating draw nothing: the loader seeds nothing

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.options: dict[str, Any] = dict(config.get("task") or {})
        self.settings = lm.model_settings(self.options)
        self.paths = data_paths(self.options)
        self.max_length: int | None = (config.get("loop") or {}).get("max_length")
        self.max_new_tokens = int(self.options.get("max_new_tokens", 32))
        self.base_seed = int(self.options.get("base_seed", 0))
        self.control_count = int(self.options.get("control_count", 4))
        self._splits: dict[str, list[dict[str, Any]]] | None = None
        self._tokenizer: Any = None
        self.tokenizer_identity = ""
        self.splits()  # a malformed file is refused when the task is built (at plan)

    # -- data -------------------------------------------------------------------------------
    def splits(self) -> dict[str, Sequence[dict[str, Any]]]:
        if self._splits is None:
            self._splits = {split: [{**row, "target": row["response"].strip()}
                                    for row in read_pairs(path)]
                            for split, path in self.paths.items()}
        return self._splits

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            splits = self.splits()
            texts = [e[part] for split in ("train", "val") for e in splits[split]
                     for part in ("prompt", "response")]
            self._tokenizer, self.tokenizer_identity = load_tokenizer(self.options, texts)
        return self._tokenizer

    def encode(self, example: dict[str, Any]) -> tuple[list[int], list[int], int, bool]:
        """(input ids, targets with -100 on the prompt, prompt length with bos, response cut)."""
        tokenizer = self.tokenizer
        prompt = tokenizer(example["prompt"], add_special_tokens=False)["input_ids"]
        response = tokenizer(example["response"], add_special_tokens=False)["input_ids"]
        head = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
        prompt = head + prompt
        inputs, targets, cut = next_token_pairs(prompt, [*response, tokenizer.eos_token_id],
                                                self.max_length)
        return inputs, targets, len(prompt), cut

    def collate(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        if not examples:
            raise ValueError("collate() was given no examples")
        encoded = [self.encode(e) for e in examples]
        longest = max(len(inputs) for inputs, *_ in encoded)
        pad = self.tokenizer.pad_token_id
        tokens = torch.full((len(examples), longest), pad, dtype=torch.long)
        targets = torch.full((len(examples), longest), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(examples), longest), dtype=torch.long)
        for row, (inputs, target, _, _) in enumerate(encoded):
            tokens[row, : len(inputs)] = torch.tensor(inputs)
            targets[row, : len(target)] = torch.tensor(target)
            mask[row, : len(inputs)] = 1
        return {
            "tokens": tokens, "targets": targets, "attention_mask": mask,
            "lengths": torch.tensor([len(inputs) for inputs, *_ in encoded]),
            "prompt_lengths": torch.tensor([length for _, _, length, _ in encoded]),
            "target_cut": torch.tensor([cut for *_, cut in encoded]),
            "ids": [e["id"] for e in examples],
        }

    # -- model --------------------------------------------------------------------------------
    def base_model(self) -> torch.nn.Module:
        return lm.build_base(self.settings, len(self.tokenizer), self.base_seed)

    def plan_problem(self) -> str | None:
        """What ``plan`` can refuse without training: a tokenizer with more tokens than a
        local base's embedding, a LoRA target that names no module of the base (its module
        tree on the meta device, no weights read), or None."""
        try:
            if self.settings["path"]:
                rows = int(lm.architecture_config(self.settings, 0).vocab_size)
                if len(self.tokenizer) > rows:
                    return (f"task.tokenizer_path: the tokenizer has {len(self.tokenizer)} "
                            f"tokens, the model's embedding {rows} rows")
            if self.settings["adapter"] == "lora":  # (a tokenizer to train is not trained here)
                meta = lm.base_on_meta(self.settings, int(self.options.get("vocab_size", 512)))
                lm.lora_targets(meta, self.options)
                lm.modules_to_save(meta, self.options)
        except ValueError as error:
            return str(error)
        return None

    # -- loss, predictions ----------------------------------------------------------------
    def loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        logits = model(input_ids=batch["tokens"], attention_mask=batch["attention_mask"]).logits
        targets = batch["targets"]
        total = torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
            ignore_index=IGNORE, reduction="sum")
        return total, (targets != IGNORE).sum()

    def targets_at_loss(self, batch: dict[str, Any]) -> list[tuple[Any, str]]:
        """(id, the response the loss trains on, decoded from the batch's targets): what the
        label gate compares with each example's response, without generating."""
        eos = self.tokenizer.eos_token_id
        pairs = []
        for row, example_id in enumerate(batch["ids"]):
            ids = [t for t in batch["targets"][row].tolist() if t not in (IGNORE, eos)]
            pairs.append((example_id, self.tokenizer.decode(ids).strip()))
        return pairs

    @torch.no_grad()
    def predict(self, model: torch.nn.Module, batch: dict[str, Any]) -> list[dict[str, Any]]:
        records = []
        device = batch["tokens"].device
        for (example_id, target), row in zip(self.targets_at_loss(batch),
                                             range(len(batch["ids"])), strict=True):
            # a prompt that max_length cut (allowed truncation) ends at the row's end
            end = min(int(batch["prompt_lengths"][row]), int(batch["lengths"][row]))
            prompt = batch["tokens"][row, :end].tolist()
            generated = greedy(model, prompt, self.max_new_tokens, self.tokenizer.eos_token_id,
                               device)
            text = self.tokenizer.decode(generated).strip()
            records.append({"id": example_id, "prediction": text, "target": target,
                            "tokens": generated})
        return records

    def score(self, records: Sequence[dict[str, Any]]) -> dict[str, float]:
        exact = sum(r["prediction"] == r["target"] for r in records)
        return {"exact_match": exact / max(1, len(records))}

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids as text, special tokens kept: what ``inspect`` shows of a collated row."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def describe(self, example: dict[str, Any]) -> dict[str, str]:
        inputs, targets, prompt_length, cut = self.encode(example)
        mask = "".join("." if t == IGNORE else "L" for t in targets)
        return {
            "prompt": example["prompt"], "response": example["response"],
            "tokens": f"{len(inputs)} input tokens, {prompt_length} of them bos + prompt",
            "mask": f"{mask}  (L: position whose next token is in the loss)",
            "truncated": "response cut by max_length" if cut else "no",
        }

    def control_inputs(self) -> Sequence[dict[str, Any]]:
        return self.splits()["val"][: self.control_count]


def greedy(model: torch.nn.Module, prompt: list[int], steps: int, eos: int,
           device: torch.device) -> list[int]:
    """At most ``steps`` tokens after ``prompt``, each the argmax (no sampling, no cache: the
    same arithmetic in the training process and in a fresh one)."""
    was_training = model.training
    model.eval()
    tokens, out = list(prompt), []
    limit = _positions(model)
    try:
        for _ in range(steps):
            if limit is not None and len(tokens) >= limit:
                break
            ids = torch.tensor([tokens], device=device)
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                           use_cache=False).logits
            token = int(logits[0, -1].float().argmax())
            if token == eos:
                break
            out.append(token)
            tokens.append(token)
    finally:
        model.train(was_training)
    return out


def _positions(model: torch.nn.Module) -> int | None:
    config = getattr(model, "config", None)
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
