"""A LightningModule as a task (``campaign.tasks.lightning``, extra ``lightning``): trained by
the campaign's loop as Lightning's own ``Trainer`` trains it (50 updates, accumulation over
equal microbatches: every update's loss within 1e-6, the final weights within 1e-5), its
``self.log`` values in the ledger and usable as ``validation.metric``, every gate of the
pilot passed through the command line, and what the loop cannot honour refused at plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from tests.conftest import require

require("lightning", "lightning")

import lightning.pytorch as pl  # noqa: E402

from campaign.cli import main  # noqa: E402
from campaign.ledger import Ledger  # noqa: E402
from campaign.loop.order_view import update_order  # noqa: E402
from campaign.loop.replay import load_final_model, verified_final  # noqa: E402
from campaign.loop.task import build_task  # noqa: E402
from campaign.loop.train import execute  # noqa: E402
from campaign.loop.trainer import seed_everything  # noqa: E402
from campaign.plan.grid import make_plan, record_plan  # noqa: E402
from campaign.plan.spec import resolve_spec  # noqa: E402

TASK = "campaign.tasks.lightning:build"
MODULES = "tests.support.lightning_modules"
DATA = {"task.module": f"{MODULES}:Classifier", "task.datamodule": f"{MODULES}:Blobs"}
UPDATES = 50


def _lightning_losses(resolved: dict[str, Any], folder: Path) -> tuple[list[float], Any]:
    """Lightning's Trainer on the same module, built as the campaign builds it, fed the
    campaign's order of examples: each microbatch's loss, and the trained module."""
    seed_everything(int(resolved["seed"]))  # as the campaign does before building the model
    task = build_task(TASK, resolved)
    train = task.splits()["train"]
    module = task.model()
    del module.log, module.log_dict  # Lightning's own logging again (the Trainer's)
    rows = update_order(TASK, resolved, 1, UPDATES)
    items = [train[int(i.split("-")[1])]["item"] for row in rows
             for chunk in row["microbatches"] for i in chunk]
    losses: list[float] = []
    step = module.training_step

    def recorded(batch: Any, batch_idx: int) -> torch.Tensor:
        loss = step(batch, batch_idx)
        losses.append(float(loss.detach()))
        return loss

    module.training_step = recorded
    loop = resolved["loop"]
    loader = torch.utils.data.DataLoader(items, batch_size=int(loop["microbatch"]))
    trainer = pl.Trainer(max_steps=UPDATES, accumulate_grad_batches=int(loop["accumulation"]),
                         accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0, num_sanity_val_steps=0, deterministic=True,
                         default_root_dir=str(folder))
    trainer.fit(module, train_dataloaders=loader)
    return losses, module


def test_the_campaign_trains_a_module_as_lightnings_trainer_does(sqlite_url: str,
                                                                 tmp_path: Path) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        spec = {"campaign": {"name": "lit", "question": "q", "task": TASK},
                "hold": {"loop.microbatch": 4, "loop.accumulation": 2,
                         "budget.updates": UPDATES},
                "config": {**DATA, "task.hidden": 16},
                "validation": {"every": 10, "metric": "val/acc", "mode": "max"},
                "grid": {"seeds": [0], "control": "only", "variants": [{"name": "only"}]}}
        record, _ = record_plan(ledger, make_plan(resolve_spec(spec, "<lit>")))
        (run_id,) = record.run_ids
        outcome = execute(ledger, run_id, artifacts=tmp_path / "a", replay_in_subprocess=False)
        assert outcome.status == "completed", outcome
        resolved = ledger.run(run_id).config_document
        points = ledger.metrics("lit")
        events = ledger.events("lit", run_id=run_id)
        _, path = verified_final(ledger, run_id)
    theirs, module = _lightning_losses(resolved, tmp_path / "pl")
    per_update = [sum(theirs[i : i + 2]) / 2 for i in range(0, len(theirs), 2)]
    ours = points[points["key"] == "train/loss"].sort_values("step")["value"].tolist()
    assert len(ours) == len(per_update) == UPDATES
    assert ours == pytest.approx(per_update, rel=1e-6)
    _, trained, _ = load_final_model(path, TASK)
    for mine, lightnings in zip(trained.parameters(), module.parameters(), strict=True):
        assert torch.allclose(mine, lightnings, rtol=1e-5, atol=1e-6)
    lr = points[points["key"] == "train/lr"].sort_values("step")["value"].tolist()
    assert lr[0] == pytest.approx(0.05) and lr[-1] == pytest.approx(0.05 * 0.5**4)  # StepLR(10)
    assert {"train/acc", "val/acc"} <= set(points["key"])  # what the module logged
    (said,) = events.query("kind == 'optimizer'")["detail"]
    assert said == "the task's own: SGD (lr 0.05), StepLR stepped per update"


def _spec(tmp_path: Path, module: str, extra: str = "") -> Path:
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'[campaign]\nname = "lit"\nquestion = "q"\ntask = "{TASK}"\n'
        f'[hold]\n"budget.updates" = 20\n"loop.microbatch" = 8\n'
        f'"task.module" = "{MODULES}:{module}"\n{extra}'
        '[validation]\nevery = 10\nmetric = "val/acc"\nmode = "max"\n'
        '[grid]\nseeds = [0]\ncontrol = "a"\n[[grid.variants]]\nname = "a"\n'
        '[[grid.variants]]\nname = "b"\nset = { "task.hidden" = 32 }\n')
    return spec


@pytest.mark.slow
def test_a_module_with_its_own_data_plans_pilots_and_trains(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    spec = _spec(tmp_path, "OwnData")
    for arguments in (["plan", str(spec)], ["pilot", "lit"],
                      ["launch", "lit", "--workers", "2", "--artifacts", str(tmp_path / "a")]):
        done = CliRunner().invoke(main, ["--ledger", url, *arguments])
        assert done.exit_code == 0, (arguments, done.output)
    with Ledger.open(url) as ledger:
        runs = ledger.runs("lit")
        values = ledger.comparison("lit", keys=["val/acc"])
        pilots = ledger.pilots("lit")
    assert set(runs["status"]) == {"completed"} and set(pilots["verdict"]) == {"pass"}
    assert (values["val/acc"] > 0.8).all()  # the blobs are learnt


@pytest.mark.parametrize(("module", "extra", "words"), [
    ("Manual", "", "uses manual optimization (automatic_optimization = False)"),
    ("TwoOptimizers", "", "gives 2 optimizers and 0 schedulers"),
    ("PerEpoch", "", "the scheduler steps per epoch (Lightning's default)"),
    ("Hooked", "", "overrides on_train_epoch_end(), a hook the campaign's loop does not call"),
    ("Classifier", '"task.hiden" = 8\n', "task.hiden: not an argument of Classifier.__init__ "
                                         "(did you mean 'hidden'?"),
    ("Classifier", '"optimizer.lr" = 0.1\n', "optimizer.lr: configure_optimizers gives the "
                                             "optimizer (task.optimizer = 'module')"),
    ("Classifier", '"task.datamodule" = "tests.support.lightning_modules:Nowhere"\n',
     "task.datamodule"),
    ("Counting", "", "Counting.training_step reads self.global_step; there is no Lightning "
                     "Trainer"),
    ("Indexed", "", "Indexed.training_step reads batch_idx, which has no equal"),
    ("Classifier", '"task.lr" = -1\n', "Classifier.configure_optimizers() failed with "
                                        "task.lr=-1: ValueError: Invalid learning rate"),
    ("Classifier", '[config]\n"task.hidden" = "wide"\n',
     "task.module: Classifier(task.hidden='wide') failed: TypeError"),
    ("Classifier", '[config]\n"task.hidden" = 8\n', None),  # fine: planned
])
def test_what_the_loop_cannot_honour_is_one_line_at_plan(sqlite_url: str, tmp_path: Path,
                                                         module: str, extra: str,
                                                         words: str | None) -> None:
    data = f'"task.datamodule" = "{MODULES}:Blobs"\n'
    extra = extra if "datamodule" in extra else data + extra
    spec = _spec(tmp_path, module, extra)
    if words is None:  # and a variant that sets the module's learning rate: ignored, refused
        done = CliRunner().invoke(main, ["--ledger", sqlite_url, "plan", str(spec),
                                         "--dry-run"])
        assert done.exit_code == 0, done.output
        spec.write_text(spec.read_text().replace('set = { "task.hidden" = 32 }',
                                                 'set = { "optimizer.lr" = 0.1 }'))
        words = "variant 'b': optimizer.lr: configure_optimizers gives the optimizer"
    done = CliRunner().invoke(main, ["--ledger", sqlite_url, "plan", str(spec), "--dry-run"])
    assert done.exit_code == 2, done.output
    assert words in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_an_override_of_the_modules_arguments_is_named_in_its_refusal(sqlite_url: str,
                                                                     tmp_path: Path) -> None:
    spec = _spec(tmp_path, "Classifier", f'"task.datamodule" = "{MODULES}:Blobs"\n')
    for given in ("task.hiddn", "config.task.hiddn", "hold.task.hiddn"):
        done = CliRunner().invoke(main, ["--ledger", sqlite_url, "plan", str(spec),
                                         "--dry-run", "--set", f"{given}=8"])
        assert done.exit_code == 2, done.output
        assert (f"{spec}: --set {given}: not an argument of Classifier.__init__ (did you mean "
                "'hidden'?") in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_unequal_microbatches_weigh_examples_where_lightning_weighs_microbatches() -> None:
    """Two microbatches of 3 and 5 examples: the campaign's update is the mean over the 8
    examples (the loop divides the sums by all units), Lightning's the mean of the two
    microbatch means (each loss / accumulate_grad_batches). Documented, not hidden."""
    config = {"task": {"module": f"{MODULES}:Classifier",
                       "datamodule": f"{MODULES}:Blobs"}, "loop": {}, "seed": 0}
    task = build_task(TASK, config)
    model = task.model()
    train = task.splits()["train"]
    small, large = (task.collate([train[i] for i in rows]) for rows in (range(3), range(3, 8)))
    sums = [task.loss(model, batch) for batch in (small, large)]
    campaign = sum(total for total, _ in sums) / sum(units for _, units in sums)
    lightning = sum(total / units for total, units in sums) / 2
    per_example = torch.nn.functional.cross_entropy(
        model(torch.cat([small["batch"][0], large["batch"][0]])),
        torch.cat([small["batch"][1], large["batch"][1]]))
    assert float(campaign) == pytest.approx(float(per_example), rel=1e-6)
    assert abs(float(campaign) - float(lightning)) > 1e-4  # the two conventions differ
