"""The tokenizer: loaded from a local folder, or trained on the campaign's own data once.

``task.tokenizer_path`` (or ``task.model_path``) names a folder holding a
Hugging Face tokenizer: it is loaded with ``local_files_only`` (nothing is
downloaded). Without one, a byte-level BPE tokenizer is trained with the
``tokenizers`` library on the training and validation texts at first use and
cached under ``CAMPAIGN_ARTIFACTS/tokenizers/<hash of the texts and
settings>/tokenizer.json``; a lock makes concurrent runs share one training,
so every run of a campaign, and every fresh process that replays one, reads
the same file. The file's SHA-256 is part of the base model's identity.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")  # pad 0, bos 1, eos 2, unk 3
FORMAT = 1  # bump when the trained tokenizer's recipe changes: the cache key follows


def load_tokenizer(options: dict[str, Any], texts: Sequence[str]) -> tuple[Any, str]:
    """(a ``PreTrainedTokenizerFast`` with pad, bos and eos set, its identity)."""
    # tokenizers' own thread pool would be forked into loader workers (and warn there)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    folder = options.get("tokenizer_path") or options.get("model_path")
    if folder:
        path = Path(str(folder)).expanduser()
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as error:
            key = "tokenizer_path" if options.get("tokenizer_path") else "model_path"
            raise ValueError(f"task.{key}: no tokenizer in {path} ({error})") from None
        if tokenizer.pad_token_id is None:  # causal models often ship without one
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer, f"{path} ({_folder_hash(path)[:16]})"
    size = int(options.get("vocab_size", 512))
    cached = _trained(texts, size)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(cached), pad_token=SPECIALS[0], bos_token=SPECIALS[1],
        eos_token=SPECIALS[2], unk_token=SPECIALS[3])
    return tokenizer, f"trained byte-level BPE {size} ({_file_hash(cached)[:16]})"


def cache_root() -> Path:
    return Path(os.environ.get("CAMPAIGN_ARTIFACTS", "campaign-artifacts")) / "tokenizers"


def _trained(texts: Sequence[str], size: int) -> Path:
    key = hashlib.sha256(json.dumps([FORMAT, size, list(texts)]).encode()).hexdigest()[:24]
    folder = cache_root() / key
    target = folder / "tokenizer.json"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder / ".lock"):
        if not target.is_file():  # another process may have trained it while we waited
            from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

            tokenizer = Tokenizer(models.BPE(unk_token=SPECIALS[3]))
            tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tokenizer.decoder = decoders.ByteLevel()
            trainer = trainers.BpeTrainer(
                vocab_size=size, special_tokens=list(SPECIALS), show_progress=False,
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
            tokenizer.train_from_iterator(texts, trainer)
            partial = folder / f"tokenizer.json.{os.getpid()}.partial"
            tokenizer.save(str(partial))
            os.replace(partial, target)
    return target


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _folder_hash(path: Path) -> str:
    digest = hashlib.sha256()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                 "tokenizer.model", "special_tokens_map.json"):
        file = path / name
        if file.is_file():
            digest.update(name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()
