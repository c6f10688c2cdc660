"""Sequence classification with any ``AutoModelForSequenceClassification``: a local
pretrained folder or an architecture and its sizes, full fine-tuning or LoRA (PEFT).

The classes are the model's: ``task.labels`` (names in class-number order), else a local
folder's ``id2label``, else (a model built from a config) the data's class names, sorted.
Every example's label is checked against them when the task is built, so ``plan`` refuses a
mismatch before anything trains: a class name the model does not have, a class number past
its head, or a number whose name in the data (``class_name``) is not the model's name for
it. A model numbering its classes differently from the data still computes a loss, and
trains the wrong task (the articles' warning); the data gate checks ``class_name`` against
``classes[label]`` again on the batches the loss sees.

Texts are tokenised by the model folder's tokenizer or one trained on the campaign's texts
(:mod:`campaign.tasks.causal_lm.tokenizer`), cut at ``loop.max_length``, right-padded. The
loss is the *sum* of the examples' cross-entropy and the units their count; predictions
and scores are the classifier's (:class:`campaign.Task`: accuracy and macro-F1).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from campaign.loop.task_base import Task
from campaign.tasks.causal_lm import model as lm
from campaign.tasks.causal_lm.tokenizer import load_tokenizer
from campaign.tasks.hf_classify.text_file import data_paths, read_examples
from campaign.tasks.hf_parts import HFModelParts

AUTO = "AutoModelForSequenceClassification"
DEFAULT_NAME = re.compile(r"^LABEL_\d+$")  # transformers' names when a config names none


class HFClassifyTask(HFModelParts, Task):
    """The task contract (docs/tasks.md) for text -> class."""

    metrics = ("accuracy", "macro_f1")
    random_examples = False  # reading and collating draw nothing: the loader seeds nothing
    inputs = "input_ids"
    peft_task_type = "SEQ_CLS"  # PEFT trains the classifier head in full beside the adapter

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.settings = lm.model_settings(self.options)
        self.max_length: int | None = (config.get("loop") or {}).get("max_length")
        self.base_seed = int(self.options.get("base_seed", 0))
        self.control_count = int(self.options.get("control_count", 4))
        raw = {split: read_examples(path) for split, path in data_paths(self.options).items()}
        self.classes = self._classes(raw)
        self._splits = {split: [self._labelled(e) for e in examples]
                        for split, examples in raw.items()}
        self._tokenizer: Any = None
        self.tokenizer_identity = ""

    # -- classes ---------------------------------------------------------------------------
    def _classes(self, raw: dict[str, list[dict[str, Any]]]) -> list[str]:
        given = self.options.get("labels")
        own, head = self._folder_names()
        if given is not None:
            if own is not None and list(given) != own:
                raise ValueError(f"task.labels: the model in {self.settings['path']} names "
                                 f"its classes {own} (its id2label), task.labels {list(given)}")
            if head is not None and len(given) != head:
                raise ValueError(f"task.labels: the classifier in {self.settings['path']} has "
                                 f"{head} classes, task.labels names {len(given)}")
            return [str(name) for name in given]
        if own is not None:
            return own
        if head is not None:  # a trained head whose classes have no names: never by alphabet
            raise ValueError(f"task.labels: the classifier in {self.settings['path']} names "
                             f"its {head} classes only LABEL_0.. (id2label): name them in "
                             "class-number order with task.labels")
        return self._data_classes(raw)

    @staticmethod
    def _data_classes(raw: dict[str, list[dict[str, Any]]]) -> list[str]:
        """A model built from a config: the data's numbering where it numbers and names its
        classes (checked to be one numbering, 0..k-1), else its class names sorted."""
        numbered: dict[int, tuple[str, str]] = {}
        for example in (e for es in raw.values() for e in es):
            label, name = example["label"], example.get("class_name")
            if isinstance(label, int) and name is not None:
                first = numbered.setdefault(label, (name, example["where"]))
                if first[0] != name:
                    raise ValueError(f"{example['where']} (id {example['id']!r}): class {label} "
                                     f"is named {name!r} here and {first[0]!r} at {first[1]}")
        if numbered:
            if sorted(numbered) != list(range(len(numbered))):
                raise ValueError(f"task.labels: the data numbers its classes {sorted(numbered)}"
                                 ", not 0 to k - 1: name them in order with task.labels")
            return [numbered[i][0] for i in range(len(numbered))]
        named = {e["label"] for es in raw.values() for e in es if isinstance(e["label"], str)}
        if not named:
            raise ValueError("task.labels: the data numbers its classes without naming them "
                             "and the model has no names of its own: name them in class-"
                             "number order (task.labels = [\"negative\", \"positive\"])")
        return sorted(str(name) for name in named)

    def _folder_names(self) -> tuple[list[str] | None, int | None]:
        """A local folder's class names in class-number order (None for a model built from a
        config, or names that are only transformers' default ``LABEL_i``), and the size of
        its head when the folder holds a trained classifier (``*ForSequenceClassification``
        in its config's ``architectures``; None otherwise: a head is drawn for it)."""
        if not self.settings["path"]:
            return None, None
        config = lm.architecture_config(self.settings, 0)
        names = [str(config.id2label[i]) for i in sorted(config.id2label)]
        trained = any(str(a).endswith("ForSequenceClassification")
                      for a in getattr(config, "architectures", None) or [])
        own = None if all(DEFAULT_NAME.match(n) for n in names) else names
        return own, (int(config.num_labels) if trained else None)

    def _labelled(self, example: dict[str, Any]) -> dict[str, Any]:
        """The example with ``label`` the model's class number and ``class_name`` its name;
        a ValueError naming the file, row and id when the data and the model disagree."""
        label, where = example["label"], f"{example['where']} (id {example['id']!r})"
        if isinstance(label, str):
            if label not in self.classes:
                raise ValueError(f"{where}: class {label!r} is not one of the model's "
                                 f"classes {self.classes}{self._hint()}")
            number = self.classes.index(label)
        else:
            number = label
            if not 0 <= number < len(self.classes):
                raise ValueError(f"{where}: class number {number} is past the model's "
                                 f"{len(self.classes)} classes {self.classes}")
        named = example.get("class_name")
        if named is not None and named != self.classes[number]:
            raise ValueError(f"{where}: the model's id2label[{number}] is "
                             f"{self.classes[number]!r} but the data names class {number} "
                             f"{named!r}: the model and the data number the classes "
                             "differently")
        kept = {k: v for k, v in example.items() if k not in ("where", "label", "class_name")}
        return {**kept, "label": number, "class_name": self.classes[number]}

    def _hint(self) -> str:
        return ("; name the classes in the model's order with task.labels"
                if self.settings["path"] and self._folder_names()[0] is None else "")

    # -- data ------------------------------------------------------------------------------
    def splits(self) -> dict[str, Sequence[dict[str, Any]]]:
        return self._splits

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            texts = [e["text"] for split in ("train", "val") for e in self._splits[split]]
            self._tokenizer, self.tokenizer_identity = load_tokenizer(self.options, texts)
        return self._tokenizer

    def collate(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        if not examples:
            raise ValueError("collate() was given no examples")
        encoded = self.tokenizer([e["text"] for e in examples], add_special_tokens=True,
                                 truncation=self.max_length is not None,
                                 max_length=self.max_length, padding=True,
                                 return_tensors="pt")
        return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"],
                "lengths": encoded["attention_mask"].sum(dim=1),
                "label": torch.tensor([e["label"] for e in examples]),
                "ids": [e["id"] for e in examples]}

    def describe(self, example: dict[str, Any]) -> dict[str, str]:
        tokens = len(self.tokenizer(example["text"])["input_ids"])
        cut = self.max_length is not None and tokens > self.max_length
        return {"text": example["text"][:200], "label": f"{example['label']} "
                f"({example['class_name']})", "tokens": f"{tokens}" + (
                    f", cut to {self.max_length} by loop.max_length" if cut else "")}

    # -- model -----------------------------------------------------------------------------
    def head(self) -> dict[str, Any]:
        """What the classifier's config gets: its classes both ways and the padding token
        (a sequence classifier finds each row's last token by it)."""
        return {"num_labels": len(self.classes),
                "id2label": dict(enumerate(self.classes)),
                "label2id": {name: i for i, name in enumerate(self.classes)},
                "pad_token_id": self.tokenizer.pad_token_id}

    def base_model(self) -> torch.nn.Module:
        return lm.build_base(self.settings, len(self.tokenizer), self.base_seed, AUTO,
                             **self.head())

    def plan_problem(self) -> str | None:
        """A LoRA target that names no module of the classifier (its module tree on the
        meta device), or None; the labels were checked when the task was built."""
        try:
            if self.settings["adapter"] == "lora":
                vocab = int(self.options.get("vocab_size", 512))
                head = {"num_labels": len(self.classes)}
                lm.lora_targets(lm.base_on_meta(self.settings, vocab, AUTO, **head),
                                self.options)
        except ValueError as error:
            return str(error)
        return None

    # -- loss ------------------------------------------------------------------------------
    def outputs(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits

    def loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
        logits = self.outputs(model, batch)
        total = torch.nn.functional.cross_entropy(logits.float(), batch["label"],
                                                  reduction="sum")
        return total, len(batch["label"])

    def control_inputs(self) -> Sequence[dict[str, Any]]:
        return self._splits["val"][: self.control_count]
