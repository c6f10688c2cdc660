"""Optimizers by name, weight-decay groups and schedules (campaign/loop/optim.py): real runs
with Adam, RMSprop and SGD with momentum; a misspelt argument refused at plan; the schedule's
formulas; train/lr logged at the update that used it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from campaign.cli import main
from campaign.gates.launch_gate import open_gate
from campaign.ledger import Ledger
from campaign.loop import checkpoint as ckpt
from campaign.loop.optim import build_optimizer, decay_groups, lr_factor
from campaign.loop.train import execute
from campaign.plan.grid import make_plan, record_plan
from campaign.plan.spec import SpecError, resolve_spec

LR = 0.01


def _spec(name: str, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "campaign": {"name": name, "task": "tests.support.tasks.faulty:build",
                     "question": "Which?"},
        "hold": {"loop.microbatch": 4, "loop.accumulation": 2, "budget.updates": 12},
        "config": {"optimizer.lr": LR, "task.limit": 200, **config},
        "validation": {"every": 6, "metric": "val/accuracy", "mode": "max"},
        "grid": {"seeds": [0], "control": "only", "variants": [{"name": "only", "set": {}}]},
    }


@pytest.mark.parametrize(("config", "group", "state"), [
    ({"optimizer.name": "adam", "optimizer.args.eps": 1e-7, "optimizer.args.amsgrad": True},
     {"eps": 1e-7, "amsgrad": True}, {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}),
    ({"optimizer.name": "rmsprop", "optimizer.momentum": 0.9, "optimizer.args.alpha": 0.95},
     {"alpha": 0.95, "momentum": 0.9}, {"step", "square_avg", "momentum_buffer"}),
    ({"optimizer.name": "sgd", "optimizer.momentum": 0.9, "optimizer.args.nesterov": True,
      "scheduler.name": "cosine", "scheduler.warmup": 4, "scheduler.min_lr": 0.001,
      "scheduler.decay_updates": 10},
     {"momentum": 0.9, "nesterov": True}, {"momentum_buffer"}),
], ids=["adam", "rmsprop", "sgd-momentum-cosine"])
def test_runs_with_other_optimizers_complete_and_log_the_rate_they_used(
    sqlite_url: str, tmp_path: Path, config: dict[str, Any], group: dict[str, Any],
    state: set[str],
) -> None:
    """The optimizer the run really stepped with (its last checkpoint's state: the settings
    of its parameter groups, the buffers only that optimizer keeps) is the one configured."""
    spec = _spec("optimizers", config)
    with Ledger.open(sqlite_url, create=True) as ledger:
        record_plan(ledger, make_plan(resolve_spec(spec, "<optim>")))
        open_gate(ledger, "optimizers", skip_reason="optimizer test")
        (run_id,) = ledger.runs("optimizers")["run_id"]
        execute(ledger, run_id, artifacts=tmp_path / "a")
        run = ledger.run(run_id)
        assert run.status == "completed", run.stop_detail
        stored = run.config_document
        rates = ledger.metrics("optimizers", keys=["train/lr"]).set_index("step")["value"]
        losses = ledger.metrics("optimizers", keys=["train/loss"])["value"]
        files = ledger.artifacts("optimizers").query("kind == 'checkpoint'")
    tensors, saved = ckpt.load(Path(files["path"].iloc[-1]), files["sha256"].iloc[-1])
    stepped = ckpt.join_state(saved["optimizer"], tensors)
    assert {k: stepped["param_groups"][0][k] for k in group} == group
    assert {k for buffers in stepped["state"].values() for k in buffers} == state
    assert stored["optimizer"]["name"] == config["optimizer.name"]
    assert losses.notna().all() and len(losses) == 12
    expected = [LR * lr_factor(s, stored["scheduler"], 12, LR) for s in range(1, 13)]
    assert rates.tolist() == pytest.approx(expected, rel=1e-12)
    if stored["scheduler"]["name"] == "cosine":
        assert rates[1] == pytest.approx(LR / 4)  # warm-up: update 1 uses lr / W
        assert rates[4] == pytest.approx(LR)
        assert rates[10] == pytest.approx(0.001) and rates[12] == pytest.approx(0.001)  # floor


def test_a_misspelt_optimizer_or_argument_is_refused_at_plan_with_its_path(
    sqlite_url: str, tmp_path: Path
) -> None:
    cases = {
        "optimizer.args.epz": ({"optimizer.name": "adam", "optimizer.args.epz": 1e-8},
                               "Adam takes no argument 'epz' (did you mean 'eps'?)"),
        "optimizer.name": ({"optimizer.name": "adamm"},
                           "no torch.optim optimizer named 'adamm' (did you mean 'adam'?)"),
        "optimizer.momentum": ({"optimizer.name": "adamw", "optimizer.momentum": 0.9},
                               "AdamW takes no momentum"),
        "optimizer.args.betas": ({"optimizer.name": "adam", "optimizer.args.betas": [0.8, 0.9]},
                                 "set it as optimizer.beta1/beta2, not in optimizer.args"),
        "optimizer.beta2": ({"optimizer.name": "sgd", "optimizer.beta2": 0.95},
                            "SGD takes no betas"),
        "optimizer.args.alpha": ({"optimizer.name": "rmsprop", "optimizer.args.alpha": -0.1},
                                 "RMSprop refuses it: Invalid alpha value: -0.1"),
        "optimizer.args.eps": ({"optimizer.name": "adam", "optimizer.args.eps": -1.0},
                               "Adam refuses it: Invalid epsilon value: -1.0"),
    }
    for path, (config, message) in cases.items():
        with pytest.raises(SpecError) as refused:
            resolve_spec(_spec("bad", config), "spec.toml")
        assert f'spec.toml: config."{path}": {message}' in str(refused.value)
    with pytest.raises(SpecError, match="LBFGS needs a closure"):
        resolve_spec(_spec("bad", {"optimizer.name": "lbfgs"}), "spec.toml")
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(
        '[campaign]\nname = "bad"\nquestion = "q"\ntask = "tests.support.tasks.faulty:build"\n'
        '[hold]\n"budget.updates" = 5\n[config]\n"optimizer.name" = "sgd"\n'
        '"optimizer.args.nesterv" = true\n[validation]\nevery = 5\n'
        'metric = "val/accuracy"\nmode = "max"\n'
        '[grid]\nseeds = [0]\ncontrol = "a"\n[[grid.variants]]\nname = "a"\nset = {}\n')
    done = CliRunner().invoke(main, ["--ledger", sqlite_url, "plan", str(spec_file)])
    assert done.exit_code == 2
    assert "(did you mean 'nesterov'?)" in done.output
    assert 'config."optimizer.args.nesterv"' in done.output
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()  # nothing written


def test_the_schedules_follow_their_documented_formulas() -> None:
    base = {"warmup": 0, "min_lr": 0.0, "decay_updates": None, "step_every": 1, "gamma": 0.1}
    cosine = {**base, "name": "cosine", "warmup": 10, "min_lr": 1e-4, "decay_updates": 110}
    assert [lr_factor(u, cosine, 200, 1e-3) for u in (1, 5, 10)] == [0.1, 0.5, 1.0]
    assert lr_factor(60, cosine, 200, 1e-3) == pytest.approx(0.1 + 0.9 * 0.5)  # half way
    assert lr_factor(110, cosine, 200, 1e-3) == pytest.approx(0.1)  # the floor, then kept
    assert lr_factor(200, cosine, 200, 1e-3) == pytest.approx(0.1)
    linear = {**base, "name": "linear"}
    assert lr_factor(50, linear, 100, 1.0) == pytest.approx(0.5)
    step = {**base, "name": "step", "step_every": 30, "gamma": 0.5}
    assert [lr_factor(u, step, 100, 1.0) for u in (29, 30, 60)] == [1.0, 0.5, 0.25]
    assert lr_factor(7, {**base, "name": "constant"}, 10, 1.0) == 1.0
    assert math.isclose(lr_factor(3, {**base, "name": "linear_warmup", "warmup": 4}, 10, 1), 0.75)


def test_weight_decay_goes_to_the_chosen_parameters() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4),
                                torch.nn.Linear(4, 2))
    names = {id(p): n for n, p in model.named_parameters()}

    def decayed(rule: str) -> set[str]:
        groups = decay_groups(model, rule, 0.1)
        return {names[id(p)] for g in groups if g["weight_decay"] for p in g["params"]}

    assert decayed("all") == set(names.values())
    assert decayed("matrices") == {"0.weight", "2.weight"}  # nanoGPT: 2 or more dimensions
    assert decayed("no_bias_norm") == {"0.weight", "2.weight"}

    class RMSNorm(torch.nn.Module):  # a model's own norm (nanoGPT's, Llama's): named so
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(4, 4))

    model.append(RMSNorm())
    names = {id(p): n for n, p in model.named_parameters()}
    assert decayed("no_bias_norm") == {"0.weight", "2.weight"}
    assert decayed("matrices") == {"0.weight", "2.weight", "3.weight"}
    optimizer = build_optimizer(model, {"name": "AdamW", "lr": 1e-3, "weight_decay": 0.1,
                                        "decay": "matrices", "beta1": 0.8, "beta2": 0.95,
                                        "args": {"eps": 1e-6}})
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    assert optimizer.param_groups[0]["betas"] == (0.8, 0.95)
    assert optimizer.param_groups[0]["eps"] == 1e-6


def test_the_hugging_face_schedules_give_the_trainer_rates() -> None:
    """``hf_linear`` and ``hf_cosine``: update u has the rate transformers' own
    ``get_*_schedule_with_warmup`` gives at the scheduler's step u - 1 (as its Trainer steps
    it: the first warm-up update at 0), over a whole run; the campaign's own ``cosine``
    differs exactly where the docs say (update 1 at lr / W, not 0)."""
    from tests.conftest import require

    require("transformers", "hf")
    from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

    updates, warmup = 20, 4
    for name, theirs in (("hf_linear", get_linear_schedule_with_warmup),
                         ("hf_cosine", get_cosine_schedule_with_warmup)):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
        reference = theirs(optimizer, warmup, updates)
        expected = []
        for _ in range(updates):  # the Trainer: the step's rate, then optimizer and scheduler
            expected.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            reference.step()
        ours = [LR * lr_factor(u, {"name": name, "warmup": warmup}, updates, LR)
                for u in range(1, updates + 1)]
        assert ours == pytest.approx(expected, rel=1e-12, abs=1e-15), name
        assert ours[0] == 0.0 and ours[warmup] == pytest.approx(LR)
    assert lr_factor(1, {"name": "cosine", "warmup": warmup}, updates, LR) == 1 / warmup
