"""Optimizers by name, weight decay by parameter group, and the learning-rate schedules.

**Optimizers.** ``optimizer.name`` is any optimizer class of ``torch.optim``,
case-insensitive (``adamw``, ``adam``, ``sgd``, ``rmsprop``, ``adagrad``...).
``optimizer.lr`` and ``optimizer.weight_decay`` go to every optimizer;
``optimizer.momentum`` to those that take ``momentum`` (SGD, RMSprop);
``optimizer.beta1``/``beta2`` as ``betas`` to those that take it (Adam,
AdamW...); any other keyword argument in ``optimizer.args`` (``eps``,
``nesterov``, ``alpha``, ``amsgrad``, ``foreach``, ``fused``...). Every
argument is checked against the optimizer's own signature when planning: a
misspelt one is refused with its key path and the nearest real name, and the
values by building the optimizer over one small parameter (torch's own checks).

**Weight decay groups** (``optimizer.decay``): ``all`` parameters (the
default); ``matrices``, only parameters with 2 or more dimensions, as nanoGPT
does (biases, norm weights and other vectors are not decayed); or
``no_bias_norm``, every parameter except biases and the weights of
normalisation layers (torch's, and any module whose class name says ``norm``:
RMSNorm, nanoGPT's LayerNorm). LBFGS, SparseAdam and Muon are refused with the
reason (a closure per step, sparse gradients only, 2-D parameters only).

**Schedules** (``scheduler.name``), for update ``u`` = 1, 2, ... with peak
rate ``lr``, floor ``min_lr``, ``W`` = ``scheduler.warmup`` and horizon
``H`` = ``scheduler.decay_updates`` (default: the run's ``budget.updates``):

- warm-up, every schedule: ``lr * u / W`` for ``u <= W`` (the first update
  uses ``lr / W``, update ``W`` the full rate);
- then, with ``p = min(1, (u - W) / (H - W))``:
  ``constant`` and ``linear_warmup``: ``lr``;
  ``cosine``: ``min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2``, which is
  ``min_lr`` from update ``H`` on;
  ``linear``: ``min_lr + (lr - min_lr) * (1 - p)``;
  ``step``: ``lr * gamma ** floor((u - W) / step_every)``, never below ``min_lr``.

**Hugging Face's conventions** (``hf_linear``, ``hf_cosine``): the rates of
``transformers``' ``get_linear_schedule_with_warmup`` and
``get_cosine_schedule_with_warmup`` as its ``Trainer`` steps them (update ``u`` uses the
scheduler's step ``u - 1``): the first warm-up update uses 0, not ``lr / W``, update
``W + 1`` the full rate, and the decay reaches ``min_lr`` (0 in transformers) only one
update after ``H`` (and stays there: transformers' own cosine would rise again past a
horizon shorter than the run). Side by side, with ``W = 2``, ``H = 6``:

======== =============================== ===============================
update    ``cosine`` / ``linear``         ``hf_cosine`` / ``hf_linear``
======== =============================== ===============================
1         lr / 2                           0
2         lr                               lr / 2
3         decaying from lr                 lr
6         min_lr                           decaying, not yet 0
======== =============================== ===============================

To match a Trainer run exactly, also set ``optimizer.decay = "no_bias_norm"``: the Trainer
decays neither biases nor normalisation weights (``decay = "all"`` here decays RMSNorm's).

``train/lr`` is logged at the update that used it.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Mapping
from typing import Any

import torch

SCHEDULES = ("constant", "linear_warmup", "cosine", "linear", "step", "hf_linear", "hf_cosine")
DECAY_RULES = ("all", "matrices", "no_bias_norm")
OWN_KEYS = ("params", "lr", "weight_decay", "momentum", "betas")  # set by their own config keys
NORMS = (torch.nn.modules.batchnorm._NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm)


def optimizer_classes() -> dict[str, type[torch.optim.Optimizer]]:
    """Lower-case name -> every optimizer class ``torch.optim`` exports."""
    return {
        name.lower(): kind for name, kind in vars(torch.optim).items()
        if isinstance(kind, type) and issubclass(kind, torch.optim.Optimizer)
        and kind is not torch.optim.Optimizer
    }


def _suggest(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


REFUSED = {  # torch.optim classes the loop cannot drive, and why
    "lbfgs": "LBFGS needs a closure that re-evaluates the loss at every step; the loop "
             "takes one gradient per update",
    "sparseadam": "SparseAdam takes only sparse gradients (nn.Embedding(sparse=True)); "
                  "dense parameters need Adam or AdamW",
    "muon": "Muon takes only 2-D parameters and needs another optimizer for the rest; "
            "the loop drives one optimizer over every parameter",
}


VALUE_KEYS = (  # words of torch's own value errors -> the key that set the value
    ("learning rate", "optimizer.lr"), ("beta parameter at index 0", "optimizer.beta1"),
    ("beta parameter at index 1", "optimizer.beta2"), ("momentum", "optimizer.momentum"),
    ("weight_decay", "optimizer.weight_decay"),
)


EMPTY = "optimizer got an empty parameter list"  # torch's words once every value passed


def optimizer_problem(options: Mapping[str, Any]) -> tuple[str, str] | None:
    """(key path, what is wrong) for the first setting ``options`` cannot build, or None:
    names against the optimizer's signature, then the values by building it over no
    parameter (torch's own checks: a negative rate, a beta of 1.5...)."""
    classes = optimizer_classes()
    name = str(options.get("name", "adamw")).lower()
    if name not in classes:
        return "optimizer.name", (f"no torch.optim optimizer named {options.get('name')!r}"
                                  f"{_suggest(name, sorted(classes))}; one of "
                                  f"{', '.join(sorted(set(classes) - set(REFUSED)))}")
    if name in REFUSED:
        return "optimizer.name", REFUSED[name]
    kind = classes[name]
    accepted = [p for p in inspect.signature(kind.__init__).parameters if p != "self"]
    if options.get("momentum") and "momentum" not in accepted:
        return "optimizer.momentum", f"{kind.__name__} takes no momentum"
    for beta, default in (("beta1", 0.9), ("beta2", 0.999)):
        if options.get(beta, default) != default and "betas" not in accepted:
            return f"optimizer.{beta}", f"{kind.__name__} takes no betas"
    others = [p for p in accepted if p not in OWN_KEYS]
    for key in options.get("args") or {}:
        if key in OWN_KEYS:
            own = "beta1/beta2" if key == "betas" else key
            return f"optimizer.args.{key}", f"set it as optimizer.{own}, not in optimizer.args"
        if key not in others:
            return f"optimizer.args.{key}", (f"{kind.__name__} takes no argument {key!r}"
                                             f"{_suggest(key, others)}; it takes "
                                             f"{', '.join(others)}")
    keywords = _keywords(kind, options)
    for device_specific in ("fused", "foreach", "capturable"):  # checked on the run's device
        keywords.pop(device_specific, None)
    if "weight_decay" in accepted:
        keywords["weight_decay"] = float(options.get("weight_decay", 0.0))
    try:  # over no parameter: torch checks the values, then refuses the empty list (before
        kind([], **keywords)  # add_param_group, whose first call imports torch._dynamo: 0.9 s)
    except (ValueError, TypeError, RuntimeError) as error:
        if str(error) == EMPTY:
            return None
        words = str(error).lower()
        named = [(key.lower(), f"optimizer.args.{key}") for key in options.get("args") or {}]
        path = next((key for word, key in [*named, *VALUE_KEYS] if word in words), "optimizer")
        return path, f"{kind.__name__} refuses it: {error}"
    return None


def _keywords(kind: type[torch.optim.Optimizer], options: Mapping[str, Any]) -> dict[str, Any]:
    """The optimizer's keyword arguments from the config (``lr``, ``momentum``, ``betas`` from
    their own keys where the optimizer takes them, the rest from ``optimizer.args``)."""
    accepted = inspect.signature(kind.__init__).parameters
    keywords: dict[str, Any] = {"lr": options["lr"], **(options.get("args") or {})}
    if "momentum" in accepted:
        keywords["momentum"] = options.get("momentum", 0.0)
    if "betas" in accepted:
        keywords["betas"] = (options.get("beta1", 0.9), options.get("beta2", 0.999))
    return keywords


def build_optimizer(model: torch.nn.Module, options: Mapping[str, Any]) -> torch.optim.Optimizer:
    """The configured optimizer over ``model``'s trainable parameters, in decay groups."""
    problem = optimizer_problem(options)
    if problem is not None:
        raise ValueError(f"{problem[0]}: {problem[1]}")
    kind = optimizer_classes()[str(options.get("name", "adamw")).lower()]
    decay = float(options.get("weight_decay", 0.0))
    groups = decay_groups(model, str(options.get("decay", "all")), decay)
    return kind(groups, **_keywords(kind, options))


def decay_groups(model: torch.nn.Module, rule: str, decay: float) -> list[dict[str, Any]]:
    """Parameter groups: the decayed ones with ``weight_decay`` = ``decay``, the others 0
    (one group when every parameter is decayed; an empty group is left out)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if rule == "all" or not decay:
        return [{"params": [p for _, p in named], "weight_decay": decay}]
    if rule == "matrices":
        decayed = {n for n, p in named if p.dim() >= 2}
    else:  # no_bias_norm
        norms = {f"{m}.{n}".lstrip(".") for m, module in model.named_modules()
                 if _is_norm(module) for n, _ in module.named_parameters(recurse=False)}
        decayed = {n for n, _ in named if not n.endswith("bias") and n not in norms}
    groups = [{"params": [p for n, p in named if n in decayed], "weight_decay": decay},
              {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def _is_norm(module: torch.nn.Module) -> bool:
    """torch's normalisation layers, and any other whose class names itself one (RMSNorm,
    nanoGPT's own LayerNorm, Hugging Face's LlamaRMSNorm)."""
    return isinstance(module, NORMS) or "norm" in type(module).__name__.lower()


def lr_factor(update: int, scheduler: Mapping[str, Any], updates: int, lr: float) -> float:
    """The rate of update ``update`` (1-based) as a factor of the peak ``lr``."""
    name = scheduler.get("name", "constant")
    warmup = int(scheduler.get("warmup", 0))
    if name in ("hf_linear", "hf_cosine"):
        return _hf_factor(update - 1, name, warmup, scheduler, updates, lr)
    if warmup and update <= warmup:
        return update / warmup
    floor = float(scheduler.get("min_lr", 0.0)) / lr if lr else 0.0
    horizon = int(scheduler.get("decay_updates") or updates)
    progress = min(1.0, max(0.0, (update - warmup) / max(1, horizon - warmup)))
    if name == "cosine":
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    if name == "linear":
        return floor + (1 - floor) * (1 - progress)
    if name == "step":
        steps = (update - warmup) // max(1, int(scheduler.get("step_every", 1)))
        return max(floor, float(scheduler.get("gamma", 0.1)) ** steps)
    return 1.0


def _hf_factor(step: int, name: str, warmup: int, scheduler: Mapping[str, Any], updates: int,
               lr: float) -> float:
    """transformers' lambda at the scheduler's ``step`` (0-based), floored at ``min_lr``."""
    if step < warmup:
        return step / max(1, warmup)
    horizon = int(scheduler.get("decay_updates") or updates)
    progress = min(1.0, (step - warmup) / max(1, horizon - warmup))  # held past the horizon
    if name == "hf_linear":
        decayed = max(0.0, (horizon - step) / max(1, horizon - warmup))
    else:
        decayed = max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    floor = float(scheduler.get("min_lr", 0.0)) / lr if lr else 0.0
    return floor + (1 - floor) * decayed


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: Mapping[str, Any]
) -> torch.optim.lr_scheduler.LambdaLR:
    """The schedule as a ``LambdaLR`` whose index ``i`` is the rate of update ``i + 1``."""
    scheduler = dict(config["scheduler"])
    updates = int(config["budget"]["updates"])
    lr = float(optimizer.defaults["lr"])  # the peak rate the optimizer was built with
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda index: lr_factor(index + 1, scheduler, updates, lr))


def schedules(config: Mapping[str, Any]) -> bool:
    """False when the rate never changes (constant, no warm-up): the step is skipped."""
    return config["scheduler"]["name"] != "constant" or bool(config["scheduler"]["warmup"])


def task_optimizer(task: Any, model: torch.nn.Module) -> tuple[Any, Any, str] | None:
    """What a task that can give its own optimizer (``configure_optimizer(model)``: a
    LightningModule's ``configure_optimizers``) gives: (optimizer, scheduler or None, the
    words the run's ``optimizer`` event records), (None, None, words) when it defers to the
    spec's keys; None for a task that cannot."""
    own = getattr(task, "configure_optimizer", None)
    if not callable(own):
        return None
    given = own(model)
    if given is None:
        return None, None, "the spec's optimizer.* and scheduler.* keys"
    optimizer, scheduler = given
    rate = optimizer.param_groups[0].get("lr")
    words = f"the task's own: {type(optimizer).__name__} (lr {rate:g})"
    if scheduler is not None:
        words += f", {type(scheduler).__name__} stepped per update"
    return optimizer, scheduler, words
