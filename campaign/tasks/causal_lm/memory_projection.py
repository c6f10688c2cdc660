"""The memory of a larger model of the same family, projected from a pilot before renting.

Built on the meta device (no memory, no weights): the target's parameters
counted exactly, its adapter's too (LoRA adds ``rank * (in + out)`` for each
targeted linear layer). Training in this loop keeps float32 master weights
(bf16 is autocast), so the states are exact arithmetic:

- weights: 4 bytes a parameter;
- gradients: 4 bytes a trainable parameter;
- optimizer state: per trainable parameter, AdamW/Adam 8 bytes (two moments),
  SGD with momentum 4, RMSprop 4 (+4 with momentum, +4 centred), Adagrad 4,
  plus a 4-byte step counter per tensor where the optimizer keeps one.

Activations are an estimate: the pilot measured what one microbatch's
forward saves for backward (:mod:`campaign.pilot.activations`), apart inside
the block list and outside it. Per position and per block, the inside part
is scaled by ``(hidden + intermediate)`` of the target over the piloted model
(a Llama block saves about ``10 * hidden + 4 * intermediate`` values a
position); the outside part (embeddings, final norm, logits and their float
copies) by ``(vocabulary + hidden)``. Same microbatch, same ``max_length``,
same precision and activation checkpointing as the piloted run.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from campaign.tasks.causal_lm import model as lm

ASSUMPTIONS = (
    "estimate: weights, gradients and optimizer state exact for float32 master weights; "
    "activations scaled from the pilot's measured saved tensors per position (inside the "
    "blocks by layers x (hidden + intermediate), outside by vocabulary + hidden), same "
    "microbatch, max_length, precision and activation checkpointing; allocator overhead, "
    "temporary buffers and the CUDA context are not included"
)


def optimizer_state_bytes(options: Mapping[str, Any], trainable: int, tensors: int) -> int | None:
    """Bytes of optimizer state for ``trainable`` parameters in ``tensors`` tensors."""
    name = str(options.get("name", "adamw")).lower()
    args = options.get("args") or {}
    if name in ("adam", "adamw", "nadam", "radam", "adamax"):
        return 8 * trainable + 4 * tensors
    if name == "sgd":
        return 4 * trainable if options.get("momentum") else 0
    if name == "rmsprop":
        moments = 1 + bool(options.get("momentum")) + bool(args.get("centered"))
        return 4 * moments * trainable + 4 * tensors
    if name == "adagrad":
        return 4 * trainable + 4 * tensors
    return None


def sizes(config: Any) -> dict[str, int]:
    """hidden, intermediate, layers and vocabulary of a transformers config."""
    def first(*names: str) -> int:
        return int(next(getattr(config, n) for n in names if getattr(config, n, None)))

    hidden = first("hidden_size", "n_embd", "d_model")
    return {"hidden": hidden, "layers": first("num_hidden_layers", "n_layer", "num_layers"),
            "intermediate": int(getattr(config, "intermediate_size", None)
                                or getattr(config, "n_inner", None) or 4 * hidden),
            "vocab": int(config.vocab_size)}


def target_config(piloted: Any, overrides: Mapping[str, Any]) -> Any:
    """The piloted model's config with ``overrides`` (the target's sizes) applied."""
    for key in overrides:
        if key not in lm.SIZE_KEYS or not hasattr(piloted, key):
            known = sorted(k for k in lm.SIZE_KEYS if hasattr(piloted, k))
            raise ValueError(f"--model-config {key}: not a size of this {piloted.model_type} "
                             f"config (one of {', '.join(known)})")
    values = copy.deepcopy(piloted.to_dict())
    heads = getattr(piloted, "num_attention_heads", None)
    if heads and values.get("head_dim") == piloted.hidden_size // heads:
        values.pop("head_dim")  # derived from the sizes: the target derives its own
    values.update(overrides)
    for derived in ("model_type", "transformers_version", "architectures"):
        values.pop(derived, None)
    return lm.config_for(piloted.model_type, "--model-config", **values)


def count(config: Any, options: Mapping[str, Any]) -> dict[str, int]:
    """Parameters, trainable parameters and trainable tensors, on the meta device."""
    from transformers import AutoModelForCausalLM

    from campaign.loop.sharding import block_list

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    parameters = sum(p.numel() for p in model.parameters())
    blocks = block_list(model)  # a decoder layer: the unit a sharded run gathers whole
    unit = sum(p.numel() for p in blocks[0].parameters()) if blocks is not None else parameters
    if options.get("adapter", "none") != "lora":
        return {"parameters": parameters, "trainable": parameters,
                "tensors": len(list(model.parameters())), "unit": unit, "unit_trainable": unit}
    rank = int(options.get("lora_rank", 8))
    chosen = options.get("lora_targets") or lm.DEFAULT_TARGETS
    # what PEFT wraps: modules named by a target (or ending in ".target") with a 2-D weight
    # (Linear, GPT-2's Conv1D, Embedding), or "all-linear": every Linear but the output
    # head; rank x (rows + columns) either way round
    adapted = [m for n, m in model.named_modules()
               if (isinstance(m, torch.nn.Linear) and not n.endswith("lm_head")
                   if chosen == "all-linear" else
                   any(n == t or n.endswith("." + t) for t in chosen))
               and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2]
    trainable = sum(rank * sum(m.weight.shape) for m in adapted)
    saved = [p for n, m in model.named_modules()  # modules_to_save: trained in full, a copy
             if any(n == t or n.endswith("." + t) for t in options.get("lora_modules_to_save")
                    or ()) for p in m.parameters()]
    copies = sum(p.numel() for p in saved)
    layers = len(blocks) if blocks is not None else 1
    return {"parameters": parameters + trainable + copies, "trainable": trainable + copies,
            "tensors": 2 * len(adapted) + len(saved), "unit": unit + trainable // layers,
            "unit_trainable": trainable // layers}


def footprint(config: Any, run_config: Mapping[str, Any]) -> dict[str, int | None]:
    """Weights, gradients and optimizer state of ``config`` trained as ``run_config`` says."""
    counted = count(config, run_config.get("task") or {})
    optimizer = optimizer_state_bytes(run_config.get("optimizer") or {}, counted["trainable"],
                                      counted["tensors"])
    return {**counted, "weights_bytes": 4 * counted["parameters"],
            "gradient_bytes": 4 * counted["trainable"], "optimizer_bytes": optimizer}


def activation_bytes(measured: Mapping[str, Any], piloted: dict[str, int],
                     target: dict[str, int]) -> int:
    """One microbatch's saved activations of the target, scaled from the pilot's."""
    inside = int(measured["saved_in_blocks_bytes"])
    outside = int(measured["saved_bytes"]) - inside
    per_block = inside / max(1, piloted["layers"])
    width = (target["hidden"] + target["intermediate"]) / (
        piloted["hidden"] + piloted["intermediate"])
    head = (target["vocab"] + target["hidden"]) / (piloted["vocab"] + piloted["hidden"])
    return round(per_block * width * target["layers"] + outside * head)


def strategy_facts(side: Mapping[str, Any]) -> dict[str, Any]:
    """A footprint as the strategy sheet's state facts (campaign/pilot/strategies.py): each
    state one tensor of a parameter's rows, so a rank's share is its bytes over W."""
    rows = max(1, int(side["parameters"]))
    return {"parameters": [[rows, side["weights_bytes"]]],
            "gradients": [[rows, side["gradient_bytes"]]],
            "optimizer": [[rows, side["optimizer_bytes"] or 0]],
            "units": int(side.get("layers") or 2), "largest_unit_values": side["unit"],
            "largest_unit_bytes": 4 * side["unit"],
            "largest_unit_trainable_bytes": 4 * side["unit_trainable"]}


def project(run_config: Mapping[str, Any], measured: Mapping[str, Any],
            overrides: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows of (item, piloted measured, piloted computed, target estimate)."""
    settings = lm.model_settings(run_config.get("task") or {})
    vocab = int(measured.get("vocab_size") or 0)
    if not vocab:
        raise ValueError("the pilot recorded no vocabulary size: pilot again with this version")
    piloted = lm.architecture_config(settings, vocab)
    target = target_config(piloted, overrides)
    mine, theirs = footprint(piloted, run_config), footprint(target, run_config)
    theirs["layers"] = sizes(target)["layers"]
    measured_activations = int(measured["saved_bytes"])
    mine["activation_bytes"] = measured_activations
    theirs["activation_bytes"] = activation_bytes(measured, sizes(piloted), sizes(target))
    rows = []
    for item in ("parameters", "trainable", "weights_bytes", "gradient_bytes",
                 "optimizer_bytes", "activation_bytes"):
        rows.append({"item": item, "piloted_measured": measured_activations
                     if item == "activation_bytes" else None,
                     "piloted": mine[item], "target_estimate": theirs[item]})
    totals = [sum(v for k, v in side.items() if k.endswith("_bytes") and v is not None)
              for side in (mine, theirs)]
    rows.append({"item": "total_bytes", "piloted_measured": None, "piloted": totals[0],
                 "target_estimate": totals[1]})
    rows.append({"item": "adapter_share", "piloted_measured": None,
                 "piloted": round(mine["trainable"] / mine["parameters"], 6),
                 "target_estimate": round(theirs["trainable"] / theirs["parameters"], 6)})
    rows.append({"item": "strategy_facts", "piloted_measured": None, "piloted": None,
                 "target_estimate": strategy_facts(theirs)})
    return rows


def parse_overrides(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``("hidden_size=2048", "num_hidden_layers=24")`` -> sizes (numbers as numbers)."""
    import json

    found: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--model-config {pair!r}: expected KEY=VALUE, e.g. hidden_size=2048")
        try:
            found[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            found[key.strip()] = text
    return found
