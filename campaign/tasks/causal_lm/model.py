"""The causal language model: a local pretrained folder or a config, full or LoRA adapters.

``task.model_path``: a folder with a Hugging Face causal LM, loaded with
``local_files_only`` (nothing is downloaded). ``task.model_config``: an
architecture name and its sizes (``{ architecture = "llama", hidden_size =
128, ... }``), built with ``AutoConfig.for_model`` and initialised under
``task.base_seed`` whatever the run's seed, so every run, variant and fresh
process starts from the same base weights (what LoRA adapts must not differ
between the runs compared). ``task.adapter = "lora"`` wraps the base with
PEFT: ``lora_rank``, ``lora_alpha``, ``lora_dropout``, ``lora_targets`` (module names, or
``"all-linear"``), ``lora_modules_to_save`` (modules trained in full beside it),
``lora_use_rslora``, ``lora_init`` (PEFT's ``init_lora_weights``: true, false, "gaussian",
"pissa", "olora") and ``lora_bias``; only the adapter trains, and checkpoints hold only its
weights. The adapter's own initialisation draws from torch's global generator, which the
run seeds with its ``seed`` before the model is built: seeds differ in their adapters, a
resume or a replay rebuilds the same one (and loads the saved weights over it anyway).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

DEFAULT_TARGETS = ("q_proj", "v_proj")
SIZE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings",
             "n_embd", "n_layer", "n_head", "n_positions", "d_model", "num_layers",
             "num_heads", "ffn_dim", "rms_norm_eps", "rope_theta")


def model_settings(options: Mapping[str, Any]) -> dict[str, Any]:
    """The model part of ``task`` checked: one of model_path / model_config, the adapter."""
    path, config = options.get("model_path"), options.get("model_config")
    if bool(path) == bool(config):
        raise ValueError("task: name exactly one of model_path (a local folder) and "
                         "model_config (an architecture and its sizes)")
    if config is not None:
        if not isinstance(config, Mapping) or not isinstance(config.get("architecture"), str):
            raise ValueError("task.model_config: a table with an architecture name "
                             "(e.g. \"llama\") and its sizes")
        unknown = sorted(set(config) - {"architecture", *SIZE_KEYS})
        if unknown:
            raise ValueError(f"task.model_config.{unknown[0]}: not a size this task passes on "
                             f"(one of {', '.join(SIZE_KEYS)})")
    adapter = options.get("adapter", "none")
    if adapter not in ("none", "lora"):
        raise ValueError(f"task.adapter: {adapter!r} is not one of 'none', 'lora'")
    for key, low, kind in (("lora_rank", 1, int), ("lora_alpha", 1e-12, float),
                           ("max_new_tokens", 1, int), ("control_count", 1, int),
                           ("base_seed", 0, int), ("vocab_size", 16, int)):
        value = options.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or value < low or (kind is int and value != int(value))):
            raise ValueError(f"task.{key}: expected {'an integer' if kind is int else 'a number'}"
                             f" >= {low:g}, got {value!r}")
    dropout = options.get("lora_dropout", 0.0)
    if not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        raise ValueError(f"task.lora_dropout: expected a number in [0, 1), got {dropout!r}")
    if config is not None:
        _known_architecture(str(config["architecture"]))
        config_for(str(config["architecture"]), "task.model_config",  # the sizes checked now,
                   **{k: v for k, v in config.items() if k != "architecture"})  # not at a run
    if path and not Path(str(path)).expanduser().is_dir():
        raise ValueError(f"task.model_path: {path} is not a folder here (a model's folder, "
                         "with its config.json and weights)")
    return {"path": Path(str(path)).expanduser() if path else None,
            "config": dict(config) if config else None, "adapter": adapter}


def _known_architecture(name: str) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if name not in CONFIG_MAPPING_NAMES:
        import difflib

        close = difflib.get_close_matches(name, list(CONFIG_MAPPING_NAMES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"task.model_config.architecture: {name!r} is not a transformers "
                         f"model type{hint}, e.g. 'llama', 'gpt2', 'qwen2', 'mistral'")


def folder_config_hash(path: Path) -> str:
    """SHA-256 of a model folder's config.json: settings that live outside the weights (rope
    scaling, norms' epsilon) are part of the base's identity."""
    import hashlib

    file = path / "config.json"
    return hashlib.sha256(file.read_bytes()).hexdigest() if file.is_file() else ""


def architecture_config(settings: Mapping[str, Any], vocab_size: int, **head: Any) -> Any:
    """The transformers config of ``task.model_config`` (or of the local folder); ``head``:
    what a task's head adds to it (a classifier's ``num_labels``, ``id2label``...)."""
    from transformers import AutoConfig

    if settings["path"]:
        try:
            return AutoConfig.from_pretrained(str(settings["path"]), local_files_only=True,
                                              **head)
        except (OSError, ValueError) as error:
            raise ValueError(f"task.model_path: no model config in {settings['path']} "
                             f"({error})") from None
    sizes = {k: v for k, v in settings["config"].items() if k != "architecture"}
    return config_for(settings["config"]["architecture"], "task.model_config",
                      vocab_size=vocab_size, **sizes, **head)


def config_for(model_type: str, where: str, **values: Any) -> Any:
    """``AutoConfig.for_model`` with its refusals as one ``ValueError`` line that starts with
    ``where`` (the spec key or the option the values came from): transformers raises
    ValueError/TypeError, and huggingface_hub's strict config fields their own error class
    (a size given as text, for one)."""
    from transformers import AutoConfig

    try:
        from huggingface_hub.errors import StrictDataclassError as strict_error
    except ImportError:  # an older huggingface_hub validates nothing itself
        strict_error = ValueError
    try:
        return AutoConfig.for_model(model_type, **values)
    except (ValueError, TypeError, strict_error) as error:
        raise ValueError(f"{where}: {' '.join(str(error).split())}") from None


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' "Loading weights" progress bar off while a local base loads: it filled
    the pilot's and the run's output with bars (a run's log keeps what the task prints)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def build_base(settings: Mapping[str, Any], vocab_size: int, base_seed: int,
               auto: str = "AutoModelForCausalLM", **head: Any) -> torch.nn.Module:
    """The base model in float32 (autocast gives bf16 where configured): ``auto`` names the
    transformers class (a causal LM, a sequence classifier), ``head`` what its config adds.
    A head a local folder lacks (a classifier on a language model) is initialised under
    ``base_seed`` too, as a config-built base is."""
    import transformers

    kind = getattr(transformers, auto)
    if settings["path"]:
        path = settings["path"]
        # a head the folder lacks is drawn under base_seed; a whole folder draws nothing
        seeded = torch.random.fork_rng(devices=[]) if head else contextlib.nullcontext()
        try:
            with seeded, quiet_loading():
                if head:
                    torch.manual_seed(base_seed)
                return kind.from_pretrained(str(path), local_files_only=True,
                                            dtype=torch.float32, **head)
        except (OSError, ValueError) as error:
            what = "causal LM" if auto == "AutoModelForCausalLM" else "model"
            raise ValueError(f"task.model_path: no {what} in {path} ({error})") from None
    config = architecture_config(settings, vocab_size, **head)
    with torch.random.fork_rng(devices=[]):  # the base is a function of the config alone
        torch.manual_seed(base_seed)
        return kind.from_config(config, dtype=torch.float32)


def with_adapter(base: torch.nn.Module, options: Mapping[str, Any],
                 task_type: str = "CAUSAL_LM") -> torch.nn.Module:
    """``base`` wrapped with LoRA adapters (PEFT), the base frozen (``SEQ_CLS``: PEFT also
    trains the classifier head in full)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=int(options.get("lora_rank", 8)),
                        lora_alpha=float(options.get("lora_alpha", 16)),
                        lora_dropout=float(options.get("lora_dropout", 0.0)),
                        target_modules=lora_targets(base, options),
                        modules_to_save=modules_to_save(base, options),
                        use_rslora=bool(options.get("lora_use_rslora", False)),
                        init_lora_weights=options.get("lora_init", True),
                        bias=str(options.get("lora_bias", "none")),
                        task_type=task_type)
    with warnings.catch_warnings():  # PEFT asks through a name transformers 5 deprecates
        warnings.simplefilter("ignore", FutureWarning)
        return get_peft_model(base, config)


def lora_targets(base: torch.nn.Module, options: Mapping[str, Any]) -> list[str] | str:
    """``task.lora_targets`` (or the defaults), each naming a module of ``base``, or PEFT's
    ``"all-linear"`` (every linear layer but the output head); a ValueError names the first
    that names none (PEFT would adapt nothing, silently)."""
    targets = options.get("lora_targets") or list(DEFAULT_TARGETS)
    if targets == "all-linear":
        if not _weight_names(base):
            raise ValueError("task.lora_targets: 'all-linear', but the model has no linear layer")
        return "all-linear"
    return _named_modules(base, targets, "task.lora_targets")


def modules_to_save(base: torch.nn.Module, options: Mapping[str, Any]) -> list[str] | None:
    """``task.lora_modules_to_save``: modules trained in full beside the adapter (an output
    head, an embedding), each naming a module of ``base``."""
    names = options.get("lora_modules_to_save")
    return None if not names else _named_modules(base, names, "task.lora_modules_to_save")


def _named_modules(base: torch.nn.Module, names: Any, key: str) -> list[str]:
    if isinstance(names, str) or not all(isinstance(t, str) and t for t in names):
        raise ValueError(f"{key}: a list of module names, got {names!r}")
    present = [name for name, _ in base.named_modules()]
    missing = [t for t in names if not any(n == t or n.endswith("." + t) for n in present)]
    if missing:
        raise ValueError(f"{key}: no module named {missing[0]!r} in the model "
                         f"(its weight layers: {', '.join(sorted(_weight_names(base)))})")
    return list(names)


def base_on_meta(settings: Mapping[str, Any], vocab_size: int,
                 auto: str = "AutoModelForCausalLM", **head: Any) -> torch.nn.Module:
    """The base's module tree on the meta device: no weights read or allocated, so ``plan``
    can check names against it in milliseconds (a local folder: its config alone)."""
    import transformers

    config = architecture_config(settings, vocab_size, **head)
    with torch.device("meta"):
        return getattr(transformers, auto).from_config(config)


def _weight_names(model: torch.nn.Module) -> set[str]:
    """Names of the modules LoRA can adapt (a 2-D weight: Linear, GPT-2's Conv1D)."""
    return {n.rsplit(".", 1)[-1] for n, m in model.named_modules()
            if isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2
            and n}


def enable_checkpointing(model: torch.nn.Module) -> None:
    """The model's own activation (gradient) checkpointing, non-reentrant."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(inner, "activation_checkpointing_enable"):  # transformers >= 5.x
        inner.activation_checkpointing_enable(activation_checkpointing_kwargs={
            "use_reentrant": False})
    else:
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(inner, "enable_input_require_grads"):  # a frozen embedding feeds the blocks
        inner.enable_input_require_grads()
    inner.config.use_cache = False
