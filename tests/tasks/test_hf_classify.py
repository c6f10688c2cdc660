"""The Hugging Face sequence classifier task (``campaign.tasks.hf_classify``, extra ``hf``):
parity with the ``Trainer`` (full and LoRA, 20 updates), the model's ``id2label`` checked
against the data's class names at ``plan``, JSONL, CSV and Parquet data, and ``campaign
export`` to folders transformers and PEFT load with the campaign's own logits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from tests.conftest import require

require("transformers", "hf")
require("peft", "hf")

from campaign.cli import main  # noqa: E402
from campaign.ledger import Ledger  # noqa: E402
from campaign.loop.replay import load_final_model, verified_final  # noqa: E402
from campaign.loop.task import build_task  # noqa: E402
from tests.support.hf_trainer import LR, campaign_run, trainer_run  # noqa: E402
from tests.support.text_classes import rows, write, write_splits  # noqa: E402

TASK = "campaign.tasks.hf_classify:build"
UPDATES = 20
TINY = {"architecture": "llama", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
        "max_position_embeddings": 128}


def _config(data: dict[str, Path], adapter: dict[str, Any]) -> dict[str, Any]:
    flat = {f"task.data.{k}": str(v) for k, v in data.items()}
    flat |= {f"task.model_config.{k}": v for k, v in TINY.items()}
    flat |= {f"task.{k}": v for k, v in {"vocab_size": 200, **adapter}.items()}
    return {**flat, "optimizer.name": "adamw", "optimizer.lr": LR,
            "optimizer.weight_decay": 0.01, "optimizer.decay": "no_bias_norm",
            "scheduler.name": "hf_cosine", "scheduler.warmup": 4,
            "loop.microbatch": 2, "loop.accumulation": 4, "loop.clip_grad_norm": 1.0}


@pytest.mark.slow
@pytest.mark.parametrize("adapter", [{}, {"adapter": "lora", "lora_rank": 4}],
                         ids=["full", "lora"])
def test_the_trainer_and_the_campaign_take_the_same_updates(
    sqlite_url: str, tmp_path: Path, adapter: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Texts of different lengths (padding differs per microbatch), the same order, AdamW
    with the Trainer's decay, warm-up then cosine, clipping, microbatch 2 x accumulation 4."""
    monkeypatch.setenv("CAMPAIGN_ARTIFACTS", str(tmp_path / "a"))  # the tokenizer's cache
    data = write_splits(tmp_path / "data", items=180, train=".parquet", val=".csv")  # 1 epoch
    resolved, ours = campaign_run(sqlite_url, tmp_path / "a", "parity", _config(data, adapter),
                                  UPDATES, task=TASK, metric="val/accuracy")
    theirs = trainer_run(resolved, tmp_path / "hf", TASK, labels="label")
    assert len(theirs["loss"]) == len(ours["train/loss"]) == UPDATES
    assert theirs["loss"] == pytest.approx(ours["train/loss"], rel=1e-6)
    assert theirs["grad_norm"] == pytest.approx(ours["train/grad_norm"], rel=1e-5)
    assert len(set(ours["train/loss"])) > UPDATES // 2  # the series moves: not constants


def _spec(tmp_path: Path, task: dict[str, Any]) -> Path:
    flat = {f"{k}.{inner}": v for k, table in task.items() if isinstance(table, dict)
            for inner, v in table.items()}
    flat |= {k: v for k, v in task.items() if not isinstance(v, dict)}
    lines = "".join(f'"task.{k}" = {json.dumps(v)}\n' for k, v in flat.items())
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'[campaign]\nname = "cls"\nquestion = "q"\ntask = "{TASK}"\n'
        f'[hold]\n"budget.updates" = 4\n"loop.microbatch" = 4\n{lines}'
        '[validation]\nevery = 2\nmetric = "val/accuracy"\nmode = "max"\n'
        '[grid]\nseeds = [0]\ncontrol = "a"\n[[grid.variants]]\nname = "a"\nset = {}\n')
    return spec


def _plan(url: str, spec: Path) -> Any:
    return CliRunner().invoke(main, ["--ledger", url, "plan", str(spec), "--dry-run"])


def _folder(tmp_path: Path, classes: list[str], named: bool = True) -> Path:
    """A local classifier folder (config, weights, tokenizer) naming ``classes`` (or, not
    ``named``, only transformers' default LABEL_0.. for them)."""
    data = write_splits(tmp_path / "made", items=30)
    task = build_task(TASK, {"task": {"data": {k: str(v) for k, v in data.items()},
                                      "model_config": TINY, "vocab_size": 200,
                                      "labels": classes}, "loop": {}, "seed": 0})
    folder = tmp_path / ("model" if named else "unnamed")
    model = task.model()
    if not named:
        model.config.id2label = {i: f"LABEL_{i}" for i in range(len(classes))}
        model.config.label2id = {f"LABEL_{i}": i for i in range(len(classes))}
    model.save_pretrained(folder)
    task.tokenizer.save_pretrained(folder)
    return folder


def test_the_models_id2label_is_checked_against_the_data_at_plan(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAMPAIGN_ARTIFACTS", str(tmp_path / "a"))
    folder = _folder(tmp_path, ["negative", "neutral", "positive"])
    numbered = [{**r, "label": ["negative", "neutral", "positive"].index(str(r["label"])),
                 "class_name": r["label"]} for r in rows(30, 1)]
    swapped = [{**r, "class_name": {"negative": "positive", "positive": "negative"}.get(
        str(r["class_name"]), r["class_name"])} for r in numbered]
    val = write(tmp_path / "val.jsonl", rows(12, 2))
    cases = [  # (train rows, extra task keys, the words of the one line)
        (swapped, {}, "the model's id2label[0] is 'negative' but the data names class 0 "
                      "'positive': the model and the data number the classes differently"),
        ([{**r, "label": "happy" if i == 3 else r["label"]} for i, r in enumerate(rows(30, 1))],
         {}, "class 'happy' is not one of the model's classes"),
        ([{**r, "label": 5} for r in numbered], {}, "class number 5 is past the model's 3"),
        (numbered, {"labels": ["positive", "neutral", "negative"]},
         "task.labels: the model in"),
    ]
    for train_rows, keys, words in cases:
        train = write(tmp_path / "train.csv", train_rows)
        done = _plan(sqlite_url, _spec(tmp_path, {"model_path": str(folder), **keys,
                                                   "data": {"train": str(train),
                                                            "val": str(val)}}))
        assert done.exit_code == 2, done.output
        assert words in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    where = f"{tmp_path / 'train.csv'}:2 (id 's1-0')"  # the first row, under its header
    train = write(tmp_path / "train.csv", swapped)
    done = _plan(sqlite_url, _spec(tmp_path, {"model_path": str(folder),
                                              "data": {"train": str(train), "val": str(val)}}))
    assert where in done.stderr, done.stderr
    train = write(tmp_path / "train.csv", numbered)  # the same numbering: planned
    done = _plan(sqlite_url, _spec(tmp_path, {"model_path": str(folder),
                                              "data": {"train": str(train), "val": str(val)}}))
    assert done.exit_code == 0, done.output
    # A trained head whose classes are only LABEL_0..: never mapped by alphabet.
    unnamed = _folder(tmp_path, ["negative", "neutral", "positive"], named=False)
    for keys, words in (({}, "names its 3 classes only LABEL_0.. (id2label): name them"),
                        ({"labels": ["negative", "positive"]}, "has 3 classes, task.labels "
                                                               "names 2"),
                        ({"labels": ["negative", "neutral", "positive"]}, None)):
        done = _plan(sqlite_url, _spec(tmp_path, {"model_path": str(unnamed), **keys,
                                                  "data": {"train": str(train),
                                                           "val": str(val)}}))
        assert done.exit_code == (2 if words else 0), done.output
        assert words is None or words in done.stderr, done.stderr
    # A model built from a config takes the data's own numbering where the data gives one.
    order = ["positive", "negative", "neutral"]
    renumbered = [{**r, "label": order.index(str(r["class_name"]))} for r in numbered]
    train = write(tmp_path / "train.csv", renumbered)
    config = {"data": {"train": str(train), "val": str(val)}, "model_config": TINY,
              "vocab_size": 200}
    assert build_task(TASK, {"task": config, "loop": {}, "seed": 0}).classes == order


def test_a_bad_row_of_any_format_is_one_line_at_plan(sqlite_url: str, tmp_path: Path) -> None:
    val = write(tmp_path / "val.jsonl", rows(12, 2))
    for suffix, where in ((".jsonl", ":3:"), (".csv", ":4:"), (".parquet", ":row 3:")):
        broken = rows(10, 1)
        broken[2]["text"] = ""
        train = write(tmp_path / f"train{suffix}", broken)
        done = _plan(sqlite_url, _spec(tmp_path, {"model_config": TINY,
                                                  "data": {"train": str(train),
                                                           "val": str(val)}}))
        assert done.exit_code == 2, done.output
        assert f"{train}{where} 'text' must be a non-empty string" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("adapter", [{}, {"adapter": "lora", "lora_rank": 4}],
                         ids=["full", "lora"])
def test_a_run_exports_folders_transformers_and_peft_load_with_its_logits(
        sqlite_url: str, tmp_path: Path, adapter: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    monkeypatch.setenv("CAMPAIGN_ARTIFACTS", str(tmp_path / "a"))
    data = write_splits(tmp_path / "data", items=60)
    config = _config(data, adapter)
    campaign_run(sqlite_url, tmp_path / "a", "exp", config, 8, task=TASK,
                 metric="val/accuracy")
    with Ledger.open(sqlite_url) as ledger:
        (run_id,) = ledger.runs("exp")["run_id"]
    out = tmp_path / "export"
    done = CliRunner().invoke(main, ["--ledger", sqlite_url, "export", run_id, "--to",
                                     str(out)])
    assert done.exit_code == 0, done.output
    with Ledger.open(sqlite_url) as ledger:
        _, path = verified_final(ledger, run_id)
    task, model, _ = load_final_model(path, TASK)  # the run's model as its replay loads it
    texts = [e["text"] for e in task.splits()["val"][:6]]
    batch = task.collate(task.splits()["val"][:6])
    if adapter:
        from peft import PeftModel

        base = AutoModelForSequenceClassification.from_pretrained(out / "base")
        loaded: Any = PeftModel.from_pretrained(base, out)
    else:
        loaded = AutoModelForSequenceClassification.from_pretrained(out)
    assert loaded.config.id2label == {0: "negative", 1: "neutral", 2: "positive"}
    encoded = AutoTokenizer.from_pretrained(out)(texts, padding=True, return_tensors="pt")
    assert torch.equal(encoded["input_ids"], batch["input_ids"])
    loaded.eval()
    model.eval()
    with torch.no_grad():
        theirs, ours = loaded(**encoded).logits, task.outputs(model, batch)
    assert torch.equal(theirs, ours)  # the same weights, the same arithmetic on the CPU
