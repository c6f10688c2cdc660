"""The pilot: one recorded pass through every phase of the loop before the campaign runs.

It runs one gate class's configuration (campaign/pilot/by_class.py chooses
the run; every memory class gets its own pilot) on its longest training
examples, and stores one ``phase_measurements`` row per phase: inputs,
duration (the median of repetitions for forward, backward and update),
memory, a verdict and, on failure, what was wrong and what to do. The
verdict is kept against the frozen spec hash and the gate class; a launch of
a class without a passing pilot is refused.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from campaign.gates.classes import gate_class as class_of
from campaign.gates.classes import worst_case
from campaign.gates.stack_gate import stack_problems
from campaign.host.calls import FreshProcessFailed, run_module
from campaign.ledger import Ledger
from campaign.ledger.canonical import canonical_json
from campaign.loop import checkpoint as ckpt
from campaign.loop import task_metrics
from campaign.loop.batch_stats import accumulation_warning, batch_stat_layers, coupled_layers
from campaign.loop.data import describe_inputs, gate_view
from campaign.loop.measure import PhaseRecord, Probe
from campaign.loop.replay import replay_file_in_subprocess, write_final
from campaign.loop.run_files import artifacts_environment
from campaign.loop.task import TaskContract, build_task
from campaign.loop.trainer import SeededSplits
from campaign.pilot import activations
from campaign.pilot.advice import ADVICE, PhaseFailure
from campaign.pilot.data_gate import check_data, gate_samples
from campaign.pilot.overfit import PilotOptions, varied
from campaign.pilot.replica_check import check_replicas
from campaign.pilot.session import PilotSession
from campaign.pilot.strategies import state_facts
from campaign.plan.metric_names import metric_problem, produced
from campaign.stack.devices import precision_problem, refuse_missing_device
from campaign.stack.software import environment


@dataclass(frozen=True)
class PilotReport:
    pilot_id: int | None
    passed: bool
    records: list[PhaseRecord]
    config: dict[str, Any]
    variant: str
    number: int | None = None  # this campaign's how-many-th pilot (the id is ledger-wide)

    @property
    def label(self) -> str:
        """``pilot 2 (id 17)``: a count of the campaign's pilots, never the ledger's."""
        return f"pilot {self.number} (id {self.pilot_id})"


DEFAULT_OPTIONS = PilotOptions()
REPEATS = 5  # timed repetitions of forward, backward and update (after the first update)


class PilotRun:
    """Runs the gates for one config; ``run_pilot`` records them for a campaign."""

    def __init__(
        self,
        task_reference: str,
        config: Mapping[str, Any],
        folder: Path,
        *,
        device: str = "cpu",
        options: PilotOptions = DEFAULT_OPTIONS,
        session_factory: Callable[..., PilotSession] = PilotSession,
    ) -> None:
        self.reference = task_reference
        self.config = copy.deepcopy(dict(config))
        self.folder = folder
        self.device = torch.device(device)
        self.options = options
        self.session_factory = session_factory
        self.probe = Probe(self.device)
        self.failed: str | None = None
        self.task: TaskContract | None = None
        self.splits: SeededSplits | None = None  # the task's, asked once for every session
        self.overfit_examples: list[Any] | None = None  # chosen from the data gate's sample

    def run(self) -> list[PhaseRecord]:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._phase("data", self._data)
        self._phase("forward", self._forward)
        self._phase("backward", self._backward)
        self._phase("update_first", self._first_update)
        self._phase("update", self._later_update)
        self._phase("validation", self._validation)
        self._phase("checkpoint", self._checkpoint)
        self._phase("resume", self._resume)
        self._phase("export", self._export)
        if int(self.config["loop"].get("replicas", 1)) > 1:
            self._replicas()
        self._phase("overfit", self._overfit, independent=True)
        return self.probe.drain()

    def _replicas(self) -> None:
        """A replicated class: its ranks in their process group, a row per rank."""
        if self.failed is not None:
            self._phase("replicas", lambda _record: "")  # recorded as skipped
            return
        try:
            self.probe.records += check_replicas(self.reference, self.config, str(self.device),
                                                 self.folder)
        except Exception as error:  # a rank's task code, the group's setup
            self.probe.records.append(PhaseRecord(
                "replicas", str(self.device), verdict="fail",
                detail=f"{type(error).__name__}: {error} -> {ADVICE['replicas']}"))
        if any(r.phase == "replicas" and r.verdict == "fail" for r in self.probe.records):
            self.failed = self.failed or "replicas"

    # -- running a phase ------------------------------------------------------------

    def _phase(
        self, name: str, gate: Callable[[PhaseRecord], str], independent: bool = False
    ) -> None:
        if self.failed is not None and not independent:
            record = PhaseRecord(
                name,
                str(self.device),
                verdict="skipped",
                detail=f"not run: the {self.failed} phase failed",
            )
            self.probe.records.append(record)
            return
        with self.probe.phase(name) as record:
            assert record is not None
            try:
                record.detail = gate(record)
                record.verdict = "pass"
            except PhaseFailure as failure:
                record.verdict = "fail"
                record.detail = f"{failure} -> {failure.advice or ADVICE[name]}"
            except Exception as error:  # the task's own code failed inside this phase
                record.verdict = "fail"
                record.detail = f"{type(error).__name__}: {error} -> {ADVICE[name]}"
        if record.verdict == "fail" and not independent and self.failed is None:
            self.failed = name

    # -- the gates --------------------------------------------------------------------

    def _data(self, record: PhaseRecord) -> str:
        unfit = stack_problems(self.reference, str(self.device)) + [
            p for p in [precision_problem(self.config["loop"]["precision"], str(self.device))] if p]
        if unfit:  # the stack is a gate too: a pilot on a stack that cannot run it proves nothing
            raise PhaseFailure("software stack: " + "; ".join(unfit))
        started = time.perf_counter()
        self.task = build_task(self.reference, self.config)
        built = time.perf_counter() - started
        self.splits = SeededSplits.of(self.task, int(self.config.get("seed", 0)))
        samples = gate_samples(self.splits.splits)  # read once, for this phase's three uses
        findings = check_data(self.task, self.config, datasets=self.splits.splits,
                              samples=samples)
        record.inputs = {"splits": {k: len(v) for k, v in self.splits.splits.items()}}
        failed = [f for f in findings if not f.ok]
        if failed:
            raise PhaseFailure("; ".join(f"{f.check}: {f.detail} ({f.advice})" for f in failed))
        started = time.perf_counter()
        self.session = self.session_factory(self.task, self.config, self.device,
                                            splits=self.splits)
        # What every run pays before its first update: building the task and the model.
        record.inputs["setup_s"] = round(built + time.perf_counter() - started, 6)
        train = samples["train"][0]  # the session's training split (the same splits), as read
        self.worst = self._longest_examples(train)
        self.overfit_examples = varied(train, self.options.overfit_examples)
        warned = [f"{f.check}: {f.detail}" for f in findings if f.warning]
        sampled = [f.detail for f in findings if f.check == "sampled"]
        return f"{len(findings)} checks passed" + (
            f" ({sampled[0]})" if sampled else "") + (
            f" (warning: {'; '.join(warned)})" if warned else "")

    def _longest_examples(self, train: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The training examples (of the gate's sample of a very large split) with the longest
        encoded length, one effective batch."""
        lengths: list[int] = []
        for start in range(0, len(train), 256):
            batch = self.session.task.collate(train[start : start + 256])
            if "lengths" not in batch:
                return train[: self.session.per_update]
            lengths += [int(v) for v in batch["lengths"]]
        order = sorted(range(len(train)), key=lambda i: -lengths[i])
        return [train[i] for i in order[: self.session.per_update]]

    def _forward(self, record: PhaseRecord) -> str:
        session = self.session
        batch = session.batches(self.worst)[0]
        record.inputs = describe_inputs([batch], session.microbatch)
        session.model.train()

        def forward() -> Any:
            with session.autocast():
                return session.task.loss(session.model, batch)

        loss_sum, units = self.probe.timed(record, forward, REPEATS)
        record.inputs["activations"] = activations.measure(session.model, batch, forward)
        if int(units) <= 0:
            raise PhaseFailure("the loss counts no units (every target masked)")
        if not torch.isfinite(loss_sum.detach()).all():
            raise PhaseFailure(f"non-finite loss {float(loss_sum)} on the longest microbatch")
        if loss_sum.dim() != 0:
            raise PhaseFailure(f"loss must be a scalar sum, got shape {list(loss_sum.shape)}")
        return f"loss sum {float(loss_sum.detach()):.4g} over {int(units)} units"

    def _backward(self, record: PhaseRecord) -> str:
        session = self.session
        record.inputs = describe_inputs(session.batches(self.worst), session.microbatch)
        self.probe.timed(record, lambda: session.backward(self.worst), REPEATS)
        names = dict(session.model.named_parameters())
        missing = [n for n, p in names.items() if p.requires_grad and p.grad is None]
        broken = [
            n for n, p in names.items() if p.grad is not None and not torch.isfinite(p.grad).all()
        ]
        frozen = [n for n, p in names.items() if not p.requires_grad]
        if missing:
            raise PhaseFailure(
                f"{len(missing)} trainable parameters got no gradient: {', '.join(missing[:6])}"
            )
        if broken:
            raise PhaseFailure(f"non-finite gradients in {', '.join(broken[:6])}")
        note = f"; frozen (requires_grad=False): {', '.join(frozen[:6])}" if frozen else ""
        layers = batch_stat_layers(session.model) or (coupled_layers(  # asked when it matters
            session.task, session.model, self.worst, session.device, session.autocast,
            session.microbatch) if accumulation_warning(["?"], [self.config]) else [])
        inexact = accumulation_warning(layers, [self.config])
        note += f" (warning: {inexact})" if inexact else ""
        return f"{len(names) - len(frozen)} parameters got finite gradients{note}"

    def _first_update(self, record: PhaseRecord) -> str:
        session = self.session
        before = {n: p.detach().clone() for n, p in session.model.named_parameters()}
        loss, examples = session.update()
        record.inputs = {"examples": examples, "planned_examples_per_update": session.per_update}
        unchanged = [
            n
            for n, p in session.model.named_parameters()
            if p.requires_grad
            and p.grad is not None
            and bool(p.grad.abs().sum() > 0)
            and torch.equal(p.detach(), before[n])
        ]
        if unchanged:
            raise PhaseFailure(
                f"the optimizer step changed nothing in {len(unchanged)} "
                f"parameters with gradients: {', '.join(unchanged[:6])}"
            )
        expected = min(session.per_update, len(session.train_set))
        if examples != expected:
            raise PhaseFailure(f"{examples} examples in the update, planned {expected}")
        state = session.optimizer.state_dict()["state"]
        if not state:
            raise PhaseFailure("the optimizer kept no state after its first step")
        # the model's state in bytes, for the strategy sheet of `campaign size`
        record.inputs["state"] = state_facts(session.model, session.task, session.optimizer,
                                             self.config["loop"])
        return f"loss {loss:.4g}; {examples} examples per update as planned; step counted"

    def _later_update(self, record: PhaseRecord) -> str:
        """Updates after the first (the warm-up): the median of several is the sizing's figure."""
        loss, examples = self.probe.timed(record, self.session.update, REPEATS)
        wait = sorted(self.session.waits[-REPEATS:])[REPEATS // 2]
        share = wait / max(sorted(record.repeats)[REPEATS // 2], 1e-9)
        workers = int(self.config["loop"].get("loader_workers", 0))
        record.inputs = {"examples": examples, "data_wait_s": round(wait, 6),
                         "input_bound": round(min(1.0, share), 3), "loader_workers": workers}
        if not math.isfinite(loss):
            raise PhaseFailure(f"non-finite loss {loss} in the second update")
        return (f"loss {loss:.4g}; waited {share:.0%} of the update for data "
                f"({workers} loader workers)")

    def _validation(self, record: PhaseRecord) -> str:
        session = self.session
        seen: list[tuple[bool, bool]] = []
        hook = session.model.register_forward_pre_hook(
            lambda module, _inputs: seen.append((module.training, torch.is_grad_enabled()))
        )
        size, view = session.val_batch, session.val_view  # validation.sample, as a run has it
        record.inputs = {"examples": len(view), "batch": size}
        if len(view) < len(session.val_set):
            record.inputs["of"] = len(session.val_set)
        estimate: dict[str, float] = {}
        try:
            with task_metrics.collecting("val") as logged:  # the task's own val/ metrics
                total, units, records = session.evaluate(view, size)
            if session.train_view is not None:  # validation.train_sample: piloted, timed
                started = time.perf_counter()
                estimate = session.train_estimate()
                record.inputs["train_sample"] = len(session.train_view)
                record.inputs["train_sample_s"] = round(time.perf_counter() - started, 6)
        finally:
            hook.remove()
        if any(training for training, _ in seen):
            raise PhaseFailure("the model ran in train mode during validation")
        if any(grad for _, grad in seen):
            raise PhaseFailure("gradients were enabled during validation")
        if not session.model.training:
            raise PhaseFailure("the model stayed in eval mode after validation")
        ids = [r["id"] for r in records]
        expected = [view[i]["id"] for i in range(len(view))]
        if sorted(map(str, ids)) != sorted(map(str, expected)):
            raise PhaseFailure(f"{len(ids)} predictions for {len(expected)} validation examples")
        scores = session.task.score(records)
        own = sorted(logged.sums)
        record.inputs["metrics"] = [*produced(scores), *own]  # what a run's validation logs
        named = {"validation": {"metric": self.config["validation"]["metric"]},
                 "pilot": {"overfit_metric": self.options.overfit_metric}}
        problem = metric_problem(named, scores, own)
        if problem is not None:
            raise PhaseFailure(problem, advice="the spec must name a metric the task produces; "
                               "plan it again under a new name with that key fixed")
        return f"val/loss {total / max(1, units):.4g}; " + ", ".join(
            [f"val/{k} {v:.4g}" for k, v in scores.items()]
            + [f"{k} {v:.4g}" for k, v in estimate.items()]
        )

    def _checkpoint(self, record: PhaseRecord) -> str:
        session = self.session
        tensors, state = session.capture()
        saved = ckpt.save(self.folder / "pilot-checkpoint.safetensors", tensors, state)
        record.inputs = {"bytes": saved.size, "step": saved.step}
        loaded, loaded_state = ckpt.load(saved.path, saved.sha256)
        if not loaded_state.get("optimizer") or not ckpt.join_state(
            loaded_state["optimizer"], loaded
        ).get("state"):
            raise PhaseFailure("the checkpoint holds no optimizer state")
        self.saved = saved
        # What the process that saved it does next, for the fresh process to match.
        self.expected = session.fingerprint()
        self.expected["next_loss"] = session.update()[0]
        return f"{saved.size:,} bytes, hash verified on reload"

    def _resume(self, record: PhaseRecord) -> str:
        arguments = ["-m", "campaign.pilot.resume_check", str(self.saved.path), self.reference]
        try:
            report = run_module(arguments, task=self.reference)
        except FreshProcessFailed as error:
            raise PhaseFailure(f"the fresh process failed: {error}") from None
        record.inputs = {"checkpoint": str(self.saved.path)}
        different = [
            k
            for k in ("step", "lr", "data", "rng_draw", "next_loss")
            if report.get(k) != self.expected.get(k)
        ]
        if different:
            shown = ", ".join(
                f"{k}: {report.get(k)!r} != {self.expected.get(k)!r}" for k in different
            )
            raise PhaseFailure(f"the fresh process restored a different state: {shown}")
        return (
            f"fresh process restored step {report['step']}, LR, RNG, data position "
            f"{report['data']}; next loss identical ({report['next_loss']:.6g})"
        )

    def _export(self, record: PhaseRecord) -> str:
        path = self.folder / "pilot-final.safetensors"
        outputs = write_final(
            path,
            self.session.model,
            self.session.task,
            canonical_json(self.config),
            canonical_json(environment(self.reference)),
            self.device,
        )
        record.inputs = {"control_inputs": len(outputs)}
        result = replay_file_in_subprocess(path, self.reference)
        if not result.get("identical"):
            detail = result.get("error") or (
                f"outputs {result.get('outputs')} != {result.get('expected')}"
            )
            raise PhaseFailure(
                f"the reloaded artifact does not reproduce the control outputs: {detail}"
            )
        return f"{len(outputs)} control outputs reproduced in a fresh process"

    def _overfit(self, record: PhaseRecord) -> str:
        options = self.options
        if self.task is None:
            raise PhaseFailure("the task could not be built")
        config = copy.deepcopy(self.config)
        config["optimizer"]["lr"] = options.overfit_lr
        config["scheduler"] = {"name": "constant", "warmup": 0}
        session = self.session_factory(self.task, config, self.device, splits=self.splits)
        examples = self.overfit_examples or varied(gate_view(session.train_set)[0],
                                                   options.overfit_examples)
        criterion = options.criterion(getattr(self.task, "kind", "classification"))
        record.inputs = {"examples": len(examples), "steps": options.overfit_steps,
                         "lr": options.overfit_lr, "criterion": criterion}
        losses = []
        for _ in range(options.overfit_steps):
            loss_sum, units = session.backward(examples)
            losses.append(loss_sum / units)
            if not math.isfinite(losses[-1]):
                raise PhaseFailure(f"non-finite loss at overfit step {len(losses)}")
            session.step_optimizer()
        _, _, records = session.evaluate(examples, min(len(examples), session.val_batch))
        targets = {str(r["target"]) for r in records}
        if len(targets) < 2:  # a constant predictor would pass: that proves nothing
            raise PhaseFailure(
                f"the {len(records)} overfit examples have {len(targets)} distinct target"
                f"{'s' * (len(targets) != 1)} ({', '.join(sorted(targets)[:3])}): learning "
                "them proves nothing; the training split needs at least two targets"
            )
        # A target max_length cut (truncation allowed) cannot be predicted whole: only its
        # loss counts; every other example must be recovered.
        flags = self.task.collate(list(examples)).get("target_cut")
        cut = {e["id"] for e, f in zip(examples, flags.tolist(), strict=True) if f} if (
            flags is not None) else set()
        wrong = [r["id"] for r in records
                 if r["id"] not in cut and str(r["prediction"]) != str(r["target"])]
        ratio = losses[0] / max(losses[-1], 1e-12)
        if ratio < options.overfit_factor:
            raise PhaseFailure(
                f"loss fell only {ratio:.2f}x ({losses[0]:.4g} -> "
                f"{losses[-1]:.4g}), needed {options.overfit_factor:g}x ({criterion})"
            )
        learned = options.learned(getattr(self.task, "kind", "classification"))
        if learned.metric is not None:  # the task's own score, where exact match is unfair
            scores = session.task.score(records)
            if learned.metric not in scores:
                named = (f"[pilot] overfit_metric {learned.metric!r}" if options.overfit_metric
                         else f"a regression's default overfit criterion ({learned.words()})")
                raise PhaseFailure(f"{named} is not one of the task's scores "
                                   f"({', '.join(scores) or 'none'}): set [pilot] "
                                   "overfit_metric and overfit_threshold")
            value = float(scores[learned.metric])
            if not learned.passes(value):
                raise PhaseFailure(f"{learned.metric} {value:.4g} after overfitting, needed "
                                   f"{learned.words()} ({criterion})")
            return (f"loss {losses[0]:.4g} -> {losses[-1]:.4g} ({ratio:.0f}x), "
                    f"{learned.metric} {value:.4g} ({criterion})")
        if wrong:
            raise PhaseFailure(
                f"{len(wrong)} of {len(records)} examples not recovered after "
                f"overfitting: {', '.join(map(str, wrong[:5]))} ({criterion})"
            )
        kept = f"all {len(records) - len(cut)} predictions right" + (
            f" ({len(cut)} with targets cut by max_length, loss only)" if cut else "")
        return (
            f"loss {losses[0]:.4g} -> {losses[-1]:.4g} ({ratio:.0f}x) in "
            f"{options.overfit_steps} steps; {kept} ({criterion})"
        )


def run_pilot(
    ledger: Ledger,
    campaign: str,
    *,
    artifacts: Path,
    device: str = "cpu",
    options: PilotOptions = DEFAULT_OPTIONS,
    run: Mapping[str, Any] | None = None,
    gate_class: str | None = None,
) -> PilotReport:
    """Pilot one run's config (default: the campaign's worst case) and record every phase
    and the verdict, for ``gate_class`` (see :mod:`campaign.pilot.by_class`)."""
    record = ledger.campaign(campaign)
    refuse_missing_device(device)  # before a pilot row is written
    if run is None:
        runs = ledger.runs(campaign)
        run = worst_case(runs[runs["relaunch_of"].isna()].to_dict("records"))
    chosen = run
    gate_class = gate_class or class_of(chosen["config"]).id  # a pilot speaks for one class
    stack = environment(record.task)
    pilot_id = ledger.create_pilot(campaign, record.spec_sha256, stack, gate_class)
    number = int((ledger.pilots(campaign)["pilot_id"] <= pilot_id).sum())
    folder = Path(artifacts) / "pilots" / f"{campaign}-{pilot_id}"
    with artifacts_environment(Path(artifacts)):  # task code finds the artifacts folder
        records = PilotRun(record.task, chosen["config"], folder, device=device,
                        options=options).run()
    passed = all(r.verdict == "pass" for r in records)
    ledger.add_phase_measurements(
        [{**r.row(pilot_id=pilot_id), "inputs": r.inputs} for r in records]
    )
    ledger.set_pilot_verdict(pilot_id, "pass" if passed else "fail")
    ledger.add_event(
        campaign,
        "pilot",
        f"pilot {number} (id {pilot_id}) on variant {chosen['variant']} ({device}): "
        f"{'pass' if passed else 'fail'}",
    )
    return PilotReport(pilot_id, passed, records, chosen["config"], chosen["variant"], number)
