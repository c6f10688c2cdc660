"""Instruction fine-tuning of a causal LM (campaign.tasks.causal_lm) on CPU with a tiny Llama
config: the prompt's tokens get exactly zero gradient at the logits; a cut response is caught
by the data gate; LoRA trains only its adapter, saves only it, leaves the base bit-identical
and refuses a changed base; a SIGTERM + resume in a fresh process continues the loss series
exactly; the final adapter replays its control generations in a fresh process."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from tests.conftest import require

# The hf extra: skipped by capability without it, a failure under `make test`.
require("transformers", "hf")
require("peft", "hf")

# The causal-LM task's modules import transformers: only once it is known to be there.
from campaign.errors import CheckpointError, RunSetupFailed  # noqa: E402
from campaign.ledger import Ledger  # noqa: E402
from campaign.loop.model_state import frozen_sha256, load_saved_state  # noqa: E402
from campaign.loop.train import execute  # noqa: E402
from campaign.tasks.causal_lm.instruction_task import IGNORE, CausalLMTask  # noqa: E402
from campaign.tasks.causal_lm.instructions import write_splits  # noqa: E402
from tests.support.launch_helpers import ROOT, run_interrupt_resume  # noqa: E402
from tests.support.loop_helpers import forward_calls, plan_loop  # noqa: E402

TINY = {"architecture": "llama", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
        "max_position_embeddings": 64}


def _options(data: dict[str, Path], **more: Any) -> dict[str, Any]:
    return {"data": {k: str(v) for k, v in data.items()}, "model_config": TINY,
            "vocab_size": 300, "max_new_tokens": 6, **more}


def _flat(options: dict[str, Any], prefix: str = "task") -> dict[str, Any]:
    """Nested task options as the spec's dotted config keys."""
    flat: dict[str, Any] = {}
    for key, value in options.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}.{key}"))
        else:
            flat[f"{prefix}.{key}"] = value
    return flat


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_splits(tmp_path_factory.mktemp("instructions"), items=60)


@pytest.fixture(autouse=True)
def _artifacts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAMPAIGN_ARTIFACTS", str(tmp_path / "a"))  # the tokenizer's cache


def test_the_prompt_gets_exactly_zero_gradient_at_the_logits(data: dict[str, Path]) -> None:
    task = CausalLMTask({"task": _options(data), "loop": {}})
    model = task.model()
    batch = task.collate(task.splits()["train"][:6])
    kept: dict[str, torch.Tensor] = {}

    def keep(_module: Any, _inputs: Any, output: torch.Tensor) -> None:
        output.retain_grad()
        kept["logits"] = output

    model.lm_head.register_forward_hook(keep)
    total, units = task.loss(model, batch)
    total.backward()
    norms = kept["logits"].grad.norm(dim=-1)  # per position: how much the loss pulls on it
    in_loss = batch["targets"] != IGNORE
    positions = torch.arange(batch["tokens"].shape[1]).unsqueeze(0)
    prompt = positions < (batch["prompt_lengths"].unsqueeze(1) - 1)
    assert prompt.any() and bool((norms[prompt] == 0).all())  # exactly zero, not small
    assert bool((norms[in_loss] > 0).all()) and int(units) == int(in_loss.sum())
    assert not bool((prompt & in_loss).any())
    pads = ~in_loss & ~prompt
    assert bool((norms[pads] == 0).all())  # padding and positions past the end: no gradient
    for row, example in enumerate(task.splits()["train"][:6]):  # the loss trains the response
        assert task.targets_at_loss(batch)[row] == (example["id"], example["response"])


def test_a_cut_response_is_caught_by_the_data_gate(sqlite_url: str,
                                                   data: dict[str, Path]) -> None:
    from campaign.pilot.inspect_hosted import inspect_campaign

    with Ledger.open(sqlite_url, create=True) as ledger:
        plan_loop(ledger, "cut", task="campaign.tasks.causal_lm:build",
                  hold={"loop.max_length": 10},
                  config=_flat(_options(data)))
        found = inspect_campaign(ledger, "cut", "train", 0)
    truncation = next(f for f in found["data_gate"] if f["check"] == "truncation")
    assert not found["passed"] and truncation["verdict"] == "FAIL"
    assert "allow_target_truncation" in truncation["advice"]


def test_lora_trains_and_saves_only_its_adapter_and_resumes_and_replays_exactly(
    sqlite_url: str, tmp_path: Path, data: dict[str, Path]
) -> None:
    marker = tmp_path / "signalled"
    options = _options(data, adapter="lora", lora_rank=4, lora_alpha=8)
    common = {"hold": {"budget.updates": 10, "loop.checkpoint_every": 5},
              "validation": {"every": 5, "metric": "val/exact_match", "sample": 4},
              "task": "tests.support.tasks.lm_fault:build"}
    with Ledger.open(sqlite_url, create=True) as ledger:
        plain = plan_loop(ledger, "plain", config=_flat(options), **common)[0]
        cut = plan_loop(ledger, "cut", **common, config=_flat(
            {**options, "fault": "sigterm", "at": 14, "marker": str(marker)}))[0]
    artifacts = str(tmp_path / "a")
    run_interrupt_resume(sqlite_url, artifacts, (plain,), cut, "causal LM test")
    assert marker.exists()
    with Ledger.open(sqlite_url) as ledger:
        series = [ledger.metrics(n, keys=["train/loss"]).sort_values("step")["value"].tolist()
                  for n in ("plain", "cut")]
        starts = ledger.segments("cut")["start_step"].tolist()
        events = ledger.events("plain", run_id=plain)
        found = ledger.artifacts("plain")
    assert len(series[0]) == 10 and series[0] == series[1] and len(set(series[0])) > 5
    assert starts[0] == 0 and 0 < starts[1] < 10  # really cut, resumed from a checkpoint
    replays = events[events["kind"] == "replay"]["detail"].tolist()
    assert replays and "identical" in replays[-1]  # control generations, token by token
    started = json.loads(events[events["kind"] == "base_model"]["detail"].iloc[0])
    final = Path(found[found["kind"] == "final"]["path"].iloc[0])
    checkpoint = Path(found[found["kind"] == "checkpoint"]["path"].iloc[-1])
    with safe_open(str(final), framework="pt") as handle:
        names, metadata = list(handle.keys()), handle.metadata()
    ended = json.loads(metadata["base_model"])
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)  # only the adapter
    assert ended["sha256"] == started["sha256"]  # the base after training: bit-identical
    assert started["adapter"] == "lora" and "trained byte-level BPE" in started["tokenizer"]
    with safe_open(str(checkpoint), framework="pt") as handle:
        saved = [n for n in handle.keys() if n.startswith("model.")]  # noqa: SIM118
    assert saved and all(".lora_" in n for n in saved)

    from safetensors.torch import load_file

    config = json.loads(metadata["config"])  # the same adapter on another base: refused
    config["task"]["base_seed"] = 1
    other = CausalLMTask(config)
    model = other.model()
    assert frozen_sha256(model) != ended["sha256"]
    with pytest.raises(CheckpointError, match=r"its base's base was .* refused"):
        load_saved_state(model, load_file(str(final)), other, ended, str(final))
    same = CausalLMTask(json.loads(metadata["config"]))  # named alike, weights changed
    model = same.model()
    with torch.no_grad():
        next(p for p in model.parameters() if not p.requires_grad).add_(1e-3)
    with pytest.raises(CheckpointError, match="the base model differs from the one it was"):
        load_saved_state(model, load_file(str(final)), same, ended, str(final))


def test_a_resume_under_a_swapped_tokenizer_is_refused_and_the_run_waits(
    sqlite_url: str, tmp_path: Path, data: dict[str, Path]
) -> None:
    """The tokenizer folder a LoRA run trained with is replaced (another vocabulary) while the
    run is interrupted: the resume is refused naming the tokenizer, and the run stays
    ``interrupted`` at its checkpoint's update (before, it ended ``failed`` for good); with
    the tokenizer put back the same run resumes and completes."""
    import shutil

    original, other, folder = tmp_path / "tok-a", tmp_path / "tok-b", tmp_path / "tok"
    CausalLMTask({"task": _options(data), "loop": {}}).tokenizer.save_pretrained(original)
    CausalLMTask({"task": _options(data, vocab_size=200), "loop": {}}).tokenizer.save_pretrained(
        other)
    shutil.copytree(original, folder)
    marker = tmp_path / "signalled"
    options = _options(data, adapter="lora", lora_rank=4, tokenizer_path=str(folder),
                       fault="sigterm", at=8, marker=str(marker))
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id = plan_loop(ledger, "swap", task="tests.support.tasks.lm_fault:build",
                           hold={"budget.updates": 6, "loop.checkpoint_every": 2},
                           validation={"every": 3, "metric": "val/exact_match", "sample": 4},
                           config=_flat(options))[0]
        first = execute(ledger, run_id, artifacts=tmp_path / "a", replay_in_subprocess=False)
        assert first.status == "interrupted" and marker.exists()
        shutil.rmtree(folder)
        shutil.copytree(other, folder)
        with pytest.raises(RunSetupFailed, match=r"stays interrupted, its resume refused: "
                           r"CheckpointError: .*its base's tokenizer was"):
            execute(ledger, run_id, artifacts=tmp_path / "a", replay_in_subprocess=False)
        run = ledger.run(run_id)
        assert (run.status, run.stop_cause, run.stop_step) == ("interrupted", "interrupted",
                                                               first.step)
        assert run.stop_detail.startswith("resume refused: CheckpointError: ")
        shutil.rmtree(folder)
        shutil.copytree(original, folder)
        done = execute(ledger, run_id, artifacts=tmp_path / "a", replay_in_subprocess=False)
        assert (done.status, done.step) == ("completed", 6)
        assert ledger.segments("swap")["start_step"].tolist() == [0, first.step, first.step]


def test_the_model_own_checkpointing_gives_the_same_lora_gradients(
    data: dict[str, Path],
) -> None:
    grads, calls = [], []
    for checkpointing in (False, True):
        task = CausalLMTask({"task": _options(data, adapter="lora", lora_rank=4), "loop": {}})
        torch.manual_seed(0)  # the adapter's own initialisation draws from the run's seed
        model = task.model()
        if checkpointing:
            task.enable_activation_checkpointing(model)
        model.train()
        calls.append(forward_calls(next(m for n, m in model.named_modules()
                                        if n.endswith("layers.0.self_attn"))))
        total, _ = task.loss(model, task.collate(task.splits()["train"][:4]))
        total.backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    assert [c[0] for c in calls] == [1, 2]  # the decoder layer really recomputed in backward
    for name, grad in grads[0].items():
        assert torch.allclose(grad, grads[1][name], rtol=1e-5, atol=1e-7), name


def test_a_bad_data_line_is_one_line_at_plan(sqlite_url: str, tmp_path: Path,
                                            data: dict[str, Path]) -> None:
    broken = tmp_path / "train.jsonl"
    lines = data["train"].read_text().splitlines()
    broken.write_text("\n".join([*lines[:2], '{"id": "x", "prompt": "p"}', *lines[2:]]) + "\n")
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[campaign]\nname = "bad"\nquestion = "q"\ntask = "campaign.tasks.causal_lm:build"\n'
        f'[hold]\n"budget.updates" = 5\n"task.data.train" = "{broken}"\n'
        f'"task.data.val" = "{data["val"]}"\n"task.model_config.architecture" = "llama"\n'
        '[validation]\nevery = 5\nmetric = "val/exact_match"\nmode = "max"\n'
        '[grid]\nseeds = [0]\ncontrol = "a"\n[[grid.variants]]\nname = "a"\nset = {}\n')
    from campaign.cli import main

    done = CliRunner().invoke(main, ["--ledger", sqlite_url, "plan", str(spec)])
    assert done.exit_code == 2, done.output
    assert f"{broken}:3: 'group' must be a non-empty string" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    typo = spec.read_text().replace(f'"{broken}"', f'"{data["train"]}"').replace(
        '= "llama"', '= "lama"')
    spec.write_text(typo)
    done = CliRunner().invoke(main, ["--ledger", sqlite_url, "plan", str(spec)])
    assert done.exit_code == 2 and "(did you mean 'llama'?)" in done.stderr, done.output
    spec.write_text(typo.replace('= "lama"', '= "llama"\n"task.model_config.hidden_size" = "abc"'))
    done = CliRunner().invoke(main, ["--ledger", sqlite_url, "plan", str(spec)])
    assert done.exit_code == 2, done.output  # huggingface_hub's own error class, as one line
    assert done.stderr.startswith("campaign: ") and "field 'hidden_size'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    last = spec.read_text()  # a typo in a task key runs another experiment: refused
    for typo, said in (('"task.lora_rnak" = 16', "hold.\"task.lora_rnak\": unknown key of this "
                        "task (did you mean 'lora_rank'?)"),
                       ('"task.lora_targets" = "all-lin"',  # a union: both types named
                        'hold."task.lora_targets": expected a valid list or \'all-linear\', '
                        "got 'all-lin'"),
                       ('"task.lora_init" = "pisa"', "hold.\"task.lora_init\": expected a valid "
                        "boolean or 'gaussian', 'pissa' or 'olora', got 'pisa'")):
        spec.write_text(last.replace('"task.model_config.hidden_size" = "abc"', typo))
        done = CliRunner().invoke(main, ["--ledger", sqlite_url, "plan", str(spec), "--dry-run"])
        assert done.exit_code == 2 and said in done.stderr, done.output
    # A LoRA target that names no module: PEFT would adapt nothing the user meant. Refused at
    # plan, for the variant that names it (its model's module tree on the meta device).
    fine = last.replace('"task.model_config.hidden_size" = "abc"', '"task.adapter" = "lora"')
    spec.write_text(fine.replace("set = {}", 'set = {}\n[[grid.variants]]\nname = "b"\n'
                                 'set = { "task.lora_targets" = ["q_proj", "qkv_proj"] }'))
    done = CliRunner().invoke(main, ["--ledger", sqlite_url, "plan", str(spec), "--dry-run"])
    assert done.exit_code == 2, done.output
    assert ("variant 'b': task.lora_targets: no module named 'qkv_proj' in the model (its "
            "weight layers: " in done.stderr and "q_proj" in done.stderr), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    spec.write_text(fine)  # the default targets name modules of a llama: planned
    done = CliRunner().invoke(main, ["--ledger", sqlite_url, "plan", str(spec), "--dry-run"])
    assert done.exit_code == 0, done.output
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()


@pytest.mark.slow
def test_the_llm_demo_compares_full_and_lora_with_conclusions(tmp_path: Path) -> None:
    from campaign.demo import run_demo
    from campaign.demo_llm import SPEC
    from campaign.report.balance import balance_sheet

    result = run_demo(tmp_path, updates=12, seeds=3, workers=2, llm=True, say=lambda _: None)
    assert result.pilot_passed and result.snapshot.counts.get("completed") == 9
    with Ledger.open(result.ledger_url) as ledger:
        sheet = balance_sheet(ledger, "llm-lora")
    verdicts = sheet.conclusions.to_dict("records")
    assert {c["variant"] for c in verdicts} == {"lora-r4", "lora-r16"}
    for found in verdicts:  # each LoRA rank against full fine-tuning, seed by seed
        deltas = sheet.deltas[sheet.deltas["variant"] == found["variant"]]["delta"].tolist()
        assert found["pairs"] == len(deltas) == 3
        assert found["mean_delta"] == pytest.approx(sum(deltas) / 3)
        assert found["verdict"] in ("better", "worse", "within_noise")
        assert found["variant"] in sheet.conclusion
    assert sheet.flags.empty  # every run replayed identically
    from campaign.cli import main

    sized = CliRunner().invoke(main, [
        "--ledger", result.ledger_url, "size", "llm-lora", "--format", "json",
        "--model-config", "hidden_size=256", "--model-config", "num_hidden_layers=8"])
    assert sized.exit_code == 0, sized.output
    projected = json.loads(sized.stdout)["memory_projection"]
    assert len(projected["classes"]) == 3 and "estimate" in projected["assumptions"]
    lora = next(c for c in projected["classes"] if c["adapter"] == "lora")
    share = next(r for r in lora["rows"] if r["item"] == "adapter_share")
    assert 0 < share["target_estimate"] < share["piloted"] < 1
    full = next(c for c in projected["classes"] if c["adapter"] == "none")
    rows = {(r["strategy"], r["ranks"]): r for r in full["strategies"]}  # both, W = 1..8
    weights = next(r["target_estimate"] for r in full["rows"] if r["item"] == "weights_bytes")
    assert rows[("replicate", 4)]["weights_bytes"] == rows[("fsdp", 1)]["weights_bytes"] == weights
    assert rows[("fsdp", 4)]["weights_bytes"] == pytest.approx(weights / 4, rel=1e-6)
    assert rows[("fsdp", 4)]["per_device_bytes"] < rows[("fsdp", 2)]["per_device_bytes"] < (
        rows[("replicate", 2)]["per_device_bytes"])
    assert set(full["rentals"]) == {"replicate", "fsdp"}
    wrong = CliRunner().invoke(main, ["--ledger", result.ledger_url, "size", "llm-lora",
                                      "--model-config", "hiden_size=256"])
    assert wrong.exit_code == 2 and "--model-config hiden_size: not a size" in wrong.output
    text = CliRunner().invoke(main, ["--ledger", result.ledger_url, "size", "llm-lora",
                                     "--model-config", "hidden_size=abc"])
    assert text.exit_code == 2 and "Traceback" not in text.output, text.output
    assert "--model-config: Validation error for field 'hidden_size'" in text.stderr
    shipped = tomllib.loads((ROOT / "examples" / "llm-lora.toml").read_text())
    for section in ("config", "validation", "pilot", "stop", "grid"):  # the example is this
        assert shipped[section] == SPEC[section], section
    held = {k: v for k, v in shipped["hold"].items() if not k.startswith("task.data.")}
    assert held == SPEC["hold"]


def test_the_memory_projection_is_exact_for_states_and_close_for_activations(
    data: dict[str, Path],
) -> None:
    from campaign.pilot.activations import measure
    from campaign.tasks.causal_lm.memory_projection import project

    def measured(config: dict[str, Any]) -> tuple[dict[str, Any], int, int]:
        task = CausalLMTask(config)
        torch.manual_seed(0)
        model = task.model()
        batch = task.collate(task.splits()["train"][:8])
        found = measure(model, batch, lambda: task.loss(model, batch))
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
        total, _ = task.loss(model, batch)
        total.backward()
        optimizer.step()
        state = sum(t.numel() * t.element_size() for s in optimizer.state.values()
                    for t in s.values())
        return found, sum(p.numel() for p in model.parameters()), state

    bigger = {"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 3,
              "num_attention_heads": 4, "num_key_value_heads": 4}
    for adapter in ({}, {"adapter": "lora", "lora_rank": 4, "lora_targets": ["q_proj", "o_proj"]},
                    {"adapter": "lora", "lora_rank": 2, "lora_targets": "all-linear",
                     "lora_modules_to_save": ["lm_head"]}):
        small = {"task": _options(data, **adapter), "optimizer": {"name": "adamw"}, "loop": {}}
        found, _, _ = measured(small)
        assert found["saved_in_blocks_bytes"] > 0 and found["vocab_size"] > 0
        rows = {r["item"]: r["target_estimate"] for r in project(small, found, bigger)}
        large = {**small, "task": {**small["task"], "model_config": {**TINY, **bigger}}}
        real, parameters, state = measured(large)
        assert rows["parameters"] == parameters and rows["optimizer_bytes"] == state
        assert 0.5 <= rows["activation_bytes"] / real["saved_bytes"] <= 2.0


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_bf16_lora_with_checkpointing_runs_and_replays(
    device: str, sqlite_url: str, tmp_path: Path, data: dict[str, Path]
) -> None:
    from campaign.loop.train import execute

    options = _options(data, adapter="lora", lora_rank=4)
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id = plan_loop(ledger, "cuda-lora", task="campaign.tasks.causal_lm:build",
                           hold={"loop.precision": "bf16", "loop.activation_checkpointing": True,
                                 "budget.updates": 8},
                           validation={"every": 4, "metric": "val/exact_match", "sample": 4},
                           config=_flat(options))[0]
        outcome = execute(ledger, run_id, artifacts=tmp_path, device=device,
                          replay_in_subprocess=True)
        assert outcome.status == "completed", outcome
        losses = ledger.metrics("cuda-lora", keys=["train/loss"])["value"]
        assert len(losses) == 8 and losses.notna().all()
        events = ledger.events("cuda-lora", run_id=run_id)
    assert "identical" in events[events["kind"] == "replay"]["detail"].iloc[-1]


def test_a_local_model_folder_is_used_as_it_is_and_its_config_is_part_of_the_base(
    data: dict[str, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    made = CausalLMTask({"task": _options(data), "loop": {}})
    model = made.model()
    folder = tmp_path / "base"
    model.save_pretrained(folder)  # safetensors
    made.tokenizer.save_pretrained(folder)
    local = CausalLMTask({"task": {**_options(data), "model_config": None,
                                   "model_path": str(folder), "adapter": "lora"},
                          "loop": {}})
    capfd.readouterr()
    adapted = local.model()
    assert "Loading weights" not in capfd.readouterr().err  # no progress bar in run output
    assert local.tokenizer("sort the words: a b")["input_ids"] == made.tokenizer(
        "sort the words: a b")["input_ids"]
    frozen = {n.removeprefix("base_model.model.").replace(".base_layer", ""): p
              for n, p in adapted.named_parameters() if not p.requires_grad}
    for name, weight in model.named_parameters():
        assert torch.equal(frozen[name], weight), name
    identity = local.base_identity()
    assert identity["base"]["model_path"] == str(folder) and identity["base"]["config_sha256"]
    assert local.plan_problem() is None  # its tokenizer fits, the default targets exist
    bigger = tmp_path / "bigger"  # a tokenizer of more tokens than the base's embedding rows
    CausalLMTask({"task": _options(data, vocab_size=400), "loop": {}}).tokenizer.save_pretrained(
        bigger)
    unfit = CausalLMTask({"task": {**_options(data), "model_config": None, "adapter": "lora",
                                   "model_path": str(folder), "tokenizer_path": str(bigger)},
                          "loop": {}})
    said = unfit.plan_problem()  # at plan, before any run is built (inspect builds none)
    assert said is not None and said.startswith("task.tokenizer_path: the tokenizer has ")
    assert said.endswith(f"tokens, the model's embedding {len(made.tokenizer)} rows")
    with pytest.raises(ValueError, match=r"task\.model_path: .*missing is not a folder here"):
        CausalLMTask({"task": {**_options(data), "model_config": None,
                               "model_path": str(tmp_path / "missing")}, "loop": {}})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"task\.model_path: no tokenizer in"):
        CausalLMTask({"task": {**_options(data), "model_config": None,
                               "model_path": str(tmp_path / "empty")}, "loop": {}}).model()


@pytest.mark.slow
def test_an_export_loads_in_transformers_and_peft_with_the_campaign_logits(
    sqlite_url: str, tmp_path: Path, data: dict[str, Path]
) -> None:
    """``campaign export`` of a full fine-tune and of a LoRA run (base built from a config):
    ``AutoModelForCausalLM.from_pretrained`` and ``PeftModel.from_pretrained`` load them, and
    their logits on the control prompts are the campaign's own (the final artifact reloaded
    as its replay reloads it), bit for bit on CPU; ``--merge`` gives a plain model within
    rounding. A model card and a manifest go with each; the ledger records the export."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from campaign.cli import main
    from campaign.loop.replay import load_final_model, verified_final

    runs = {}
    with Ledger.open(sqlite_url, create=True) as ledger:
        for name, extra in (("full", {}), ("lora", {"adapter": "lora", "lora_rank": 4})):
            runs[name] = plan_loop(ledger, name, task="campaign.tasks.causal_lm:build",
                                   hold={"budget.updates": 4},
                                   validation={"every": 4, "metric": "val/exact_match",
                                               "sample": 4},
                                   config=_flat(_options(data, **extra)))[0]
            execute(ledger, runs[name], artifacts=tmp_path / "a", replay_in_subprocess=False)
        own = {}
        for name, run_id in runs.items():
            _, path = verified_final(ledger, run_id)
            task, model, _ = load_final_model(path, "campaign.tasks.causal_lm:build")
            batch = task.collate(list(task.control_inputs()))
            with torch.no_grad():
                own[name] = model.eval()(input_ids=batch["tokens"],
                                         attention_mask=batch["attention_mask"]).logits
    folders = {"full": tmp_path / "full", "lora": tmp_path / "lora",
               "merged": tmp_path / "merged"}
    for name, folder in folders.items():
        arguments = ["--ledger", sqlite_url, "export", runs["lora" if name == "merged" else name],
                     "--to", str(folder), *(["--merge"] if name == "merged" else [])]
        done = CliRunner().invoke(main, arguments)
        assert done.exit_code == 0, done.output
    loaded = {
        "full": AutoModelForCausalLM.from_pretrained(folders["full"]),
        "lora": PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(folders["lora"] / "base"), folders["lora"]),
        "merged": AutoModelForCausalLM.from_pretrained(folders["merged"]),
    }
    for name, model in loaded.items():
        with torch.no_grad():
            logits = model.eval()(input_ids=batch["tokens"],
                                  attention_mask=batch["attention_mask"]).logits
        expected = own["lora" if name == "merged" else name]
        if name == "merged":  # W + BA against xW + (xA)B: the same up to rounding
            torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(logits, expected), name
    tokenizer = AutoTokenizer.from_pretrained(folders["lora"])
    assert tokenizer("sort the words: a b")["input_ids"] == task.tokenizer(
        "sort the words: a b")["input_ids"]
    card = (folders["lora"] / "README.md").read_text()
    assert f"run id `{runs['lora']}`" in card and "frozen base: SHA-256 `" in card
    assert "PeftModel.from_pretrained(base, folder)" in card
    manifest = json.loads((folders["lora"] / "MANIFEST.json").read_text())
    assert {"adapter_config.json", "adapter_model.safetensors", "base/config.json",
            "README.md"} <= {f["path"] for f in manifest["files"]}
    with Ledger.open(sqlite_url) as ledger:
        exported = ledger.events("lora").query("kind == 'exported'")["detail"].tolist()
    assert len(exported) == 2 and all(runs["lora"] in e for e in exported)
    again = CliRunner().invoke(main, ["--ledger", sqlite_url, "export", runs["full"], "--to",
                                      str(folders["full"])])
    assert again.exit_code == 2 and "exists and is not an empty folder" in again.stderr
    merge_full = CliRunner().invoke(main, ["--ledger", sqlite_url, "export", runs["full"], "--to",
                                           str(tmp_path / "nothing"), "--merge"])
    assert merge_full.exit_code != 0 and "no adapter to merge" in merge_full.stderr
    assert not (tmp_path / "nothing").exists() and not list(tmp_path.glob(".nothing.*"))


def test_the_lora_options_reach_peft_and_are_checked_at_plan(data: dict[str, Path]) -> None:
    """``all-linear``, ``modules_to_save``, rsLoRA, the initialisation and the bias reach PEFT's
    config; the adapter's settings and where its initialisation came from are recorded with
    the base; a module to save that names nothing is refused by the plan-time check."""
    from campaign.loop.model_state import base_record

    options = _options(data, adapter="lora", lora_rank=2, lora_targets="all-linear",
                       lora_modules_to_save=["lm_head"], lora_use_rslora=True,
                       lora_init="gaussian", lora_bias="lora_only")
    task = CausalLMTask({"task": options, "loop": {}, "seed": 3})
    assert task.plan_problem() is None
    model = task.model()
    config = model.peft_config["default"]
    adapted = {name.rsplit(".", 1)[-1] for name in config.target_modules}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                       "down_proj"}  # every linear layer but the output head
    assert config.use_rslora and config.init_lora_weights == "gaussian"
    assert config.bias == "lora_only" and "lm_head" in config.modules_to_save
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any("lm_head.modules_to_save" in n for n in trainable)
    assert any(n.endswith("lora_A.default.weight") and "gate_proj" in n for n in trainable)
    recorded = base_record(model, task)
    assert recorded["lora"]["lora_targets"] == "all-linear" and recorded["lora"]["lora_rank"] == 2
    assert recorded["adapter_init"].endswith("the run's seed 3 before the model is built")
    wrong = CausalLMTask({"task": {**options, "lora_modules_to_save": ["head"]}, "loop": {}})
    assert wrong.plan_problem().startswith(
        "task.lora_modules_to_save: no module named 'head' in the model")
