"""The controlled run: one resolved config trained by the engine and recorded into the ledger.

``RunLoop`` follows torchtune's recipe shape: ``setup`` / ``train`` /
``save_checkpoint`` / ``cleanup``, invalid option combinations refused in
``__init__`` before any work. The step itself is the engine's
(:class:`~campaign.loop.trainer.Trainer`, shared with the pilot); this module
adds what makes it a recorded run. Features and their trade-offs:

- Metrics every update through the buffered ledger writer; the loss is read
  back from the device once per update (``float()`` is a host sync).
- Phase measurements on the first update (optimizer state allocation), the
  second, the first validation, checkpoints, and then every
  ``measure_every`` updates: cheap enough to leave on.
- Checkpoints every ``validation.every`` updates (or ``loop.checkpoint_every``) and at the
  stop, written atomically; a resume continues the same run id in a new
  segment and compares the steps it replays with the values first logged.
- SIGTERM/SIGINT: finish the current update, checkpoint, end ``interrupted``.
- Leases: every write carries the lease of the claim that started this segment; a lease
  gone stops the loop after the update, writing nothing more (:class:`LeaseLost`). Files of
  later segments carry their ordinal: a stale worker never overwrites its successor's.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from campaign.errors import RESUME_REFUSED, LeaseLost, LoopError, RunSetupFailed, first_line
from campaign.ledger import Claim, Ledger, StopRecord
from campaign.ledger.spill import SPILL_NAME
from campaign.loop import checkpoint as ckpt
from campaign.loop import model_state, progress_page, shard_files, task_metrics
from campaign.loop import replicas as dp
from campaign.loop.data import describe_inputs
from campaign.loop.decisions import agree, stop_at_resume, validated_at
from campaign.loop.heartbeat import Heartbeat
from campaign.loop.ledger_away import WaitingRecords, end_if_away_too_long
from campaign.loop.measure import Probe
from campaign.loop.outcome import RunOutcome
from campaign.loop.preflight import refuse_impossible
from campaign.loop.replay import EarlyReplay
from campaign.loop.resume import ResumePoint, choose_resume_point
from campaign.loop.run_end import RunEnd
from campaign.loop.run_files import record_log, save_traceback, write_predictions
from campaign.loop.signals import SignalLatch
from campaign.loop.stop import (
    PAUSED,
    StopDecision,
    StopRules,
    failure_decision,
    oom_detail,
    validates_after,
)
from campaign.loop.task import Batch, build_task
from campaign.loop.trainer import Trainer, seed_everything
from campaign.stack.software import run_environment

LEASE_GONE = (
    "heartbeat refused, the lease is gone (declared lost or taken by another worker); "
    "this worker stops without writing"
)


class RunLoop(RunEnd):
    """Executes one planned (or resumable) run; see the module docstring for the features."""

    def __init__(
        self,
        ledger: Ledger,
        run_id: str,
        *,
        artifacts: Path,
        worker: str | None = None,
        device: str = "cpu",
        heartbeat_s: float | None = 30.0,
        measure_every: int = 100,
        replay_in_subprocess: bool = True,
        claim: Claim | None = None,
        preempt_signals: Sequence[int] = (),
        replica: dp.Replica | None = None,
        resume: ResumePoint | None = None,
        log: Path | None = None,
        pause_at: int | None = None,
    ) -> None:
        self.ledger, self.run_id = ledger, run_id
        self.pause_at = pause_at  # a search's rung where the run waits for its decision
        self.record = ledger.run(run_id)
        self.task_reference = ledger.campaign(self.record.campaign).task  # read once per run
        self.config = self.record.config_document
        self.device = torch.device(device)
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}:{device}"
        self.folder = Path(artifacts) / run_id
        self.measure_every = measure_every
        self.replay_in_subprocess = replay_in_subprocess
        self.replay: EarlyReplay | None = None
        self.replica = replica or dp.Replica(0, 1)
        self.writes = self.replica.leader  # only rank 0 writes to the ledger and artifacts
        resuming = (claim is not None and claim.ordinal > 1) or (
            self.record.status in ("interrupted", "lost") or not self.replica.leader)
        refuse_impossible(self.config, run_id, self.replica.world, self.device, resuming,
                          self.replica.leader)
        if claim is not None and (claim.run_id != run_id or self.record.status != "running"):
            raise LoopError(f"run {run_id}: the claim given does not hold this run")
        self.lease: str | None = claim.lease if claim is not None else None
        self._claim, self._resume = claim, resume  # resume: the checkpoint a supervisor verified
        self.artifacts = Path(artifacts)
        self.log = log  # the supervised process's output, recorded just before the end
        # Rank 0 of several: after a failure, whether another rank was lost and how the run
        # ends then (set by whoever started the ranks: launch/run_body.py).
        self.rank_fault: Callable[[int, str], StopDecision | None] | None = None
        self.segment_id: int | None = None
        self.segment_ordinal = 0
        self.heartbeat = Heartbeat(lambda: self.ledger.heartbeat(self.run_id, lease=self.lease),
                                   heartbeat_s, f"heartbeat-{run_id}")
        self.signals = SignalLatch(preempt_signals)
        self.probe = Probe(self.device)
        self.rules = StopRules(self.config)
        self.trainer: Trainer | None = None
        self.stack: dict[str, Any] = {}
        self.metrics: Any = None
        self.waiting = WaitingRecords(self.ledger, run_id, self.folder)  # once the ledger answers
        self.step, self.examples_seen = 0, 0
        self.phase = "setup"
        self.replayed_from: int | None = None  # the step a resume restarted from
        self._pending: list[list[Any]] = []  # unflushed metric points of a resumed checkpoint
        self._batches: list[Batch] = []
        self._validated = False
        self._checkpointed: int | None = None  # the update this segment last saved
        self._resumed_stop: StopDecision | None = None  # an earlier segment's decided stop
        self.training_s = 0.0  # updates and validation; the rest of the segment is overhead

    # -- setup ---------------------------------------------------------------------

    def setup(self) -> None:
        """Take the run (unless a worker's claim already did), then build everything."""
        if not self.writes:  # a non-zero rank: rank 0 claimed the run and says where to start
            shared = dp.broadcast_json(None, self.replica, self._group_device)
            self.segment_ordinal = int(shared.get("segment") or 0)  # its files' names
            self._prepare(shared["resume_from"])
            return
        if self.replay_in_subprocess:  # its fresh child imports the task while this one trains
            self.replay = EarlyReplay(self.ledger, self.run_id, self.task_reference,
                                      str(self.device), self.log)  # on the training device
        point = self._resume or ResumePoint(None)
        if self._claim is None and self.record.status in ("interrupted", "lost"):
            # Chosen and verified before the run leaves its status: a bad checkpoint changes
            # nothing (CheckpointError), a newer damaged one is passed over and named.
            point = choose_resume_point(self.ledger, self.record.campaign, self.run_id,
                                        self.record.config_sha256, self.artifacts)
        resume_from = point.checkpoint
        claim = self._claim or self.ledger.start(
            self.run_id,
            self.worker,
            start_step=resume_from["step"] if resume_from else 0,
            resumed_from=resume_from["id"] if resume_from else None,
        )
        self.segment_id, self.segment_ordinal = claim.segment_id, claim.ordinal
        self.lease = claim.lease or None
        if point.event_detail():
            self._event("resume_fallback", str(point.event_detail()))
        self.heartbeat.start()  # from the claim on: building the model may take a while
        if self.replica.world > 1:
            dp.broadcast_json({"resume_from": resume_from, "segment": self.segment_ordinal},
                              self.replica, self._group_device)
        try:
            self._prepare(resume_from)
        except (Exception, SystemExit, KeyboardInterrupt) as error:  # it must end with a cause
            if not self.stack:  # what it failed on is part of its record
                with contextlib.suppress(Exception):
                    self._record_environment()
            # A resume that cannot start (a swapped tokenizer, a task edited since) changes
            # nothing: the run waits resumable. A first start that fails ends failed.
            resumed, detail = bool(resume_from), f"{type(error).__name__}: {first_line(error)}"
            artifact = None if isinstance(error, ckpt.CheckpointError) else self._save_traceback()
            detail += f" (traceback: artifact {artifact})" if artifact else ""
            status, cause = ("interrupted", "interrupted") if resumed else ("failed", "exception")
            if self.log is not None:  # what the task printed while failing: before the end
                record_log(self.ledger, self.run_id, self.log, self.step, lease=self.lease)
            step = int(resume_from["step"]) if resume_from else self.step  # where it waits
            self.ledger.finish(self.run_id, status, StopRecord(
                cause, step, self.phase, ("resume refused: " if resumed else "") + detail),
                lease=self.lease, training_s=0.0)
            how = RESUME_REFUSED if resumed else f"failed in {self.phase}"
            raise RunSetupFailed(f"run {self.run_id} {how}: {detail}", status) from error

    def _record_environment(self) -> None:
        if self.writes:  # (rank 0) what an archive of the run must hold; exported with it too
            self.stack = run_environment(self.task_reference, [self.artifacts])
            self.ledger.set_environment(self.run_id, self.stack, lease=self.lease)

    @property
    def _group_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def _prepare(self, resume_from: Mapping[str, Any] | None) -> None:
        progress_page.tick()
        seed_everything(int(self.config["seed"]))
        task = build_task(self.task_reference, self.record.config_document)
        progress_page.tick()
        self.trainer = Trainer(task, self.config, self.device, self.replica)
        self._record_environment()  # once the task imported its modules and read its splits
        if self.writes and self.trainer.base is not None:  # what an adapter was trained on
            self._event("base_model", model_state.as_text(self.trainer.base))
        if self.writes and self.trainer.optimizer_source:  # the task's optimizer or the spec's
            self._event("optimizer", self.trainer.optimizer_source)
        if self.writes and self.trainer.sharding is not None:  # the units, and how found
            self._event("sharding", self.trainer.sharding.describe(self.replica.world))
        progress_page.tick()
        self.rules = StopRules(self.config)  # the wall-time clock starts once the run is built
        self.rules.pause_at = self.pause_at  # a search's next rung, if it has one
        if resume_from:
            self._restore(resume_from)
        self.metrics = (self.ledger.metric_writer(self.run_id, self.segment_id, lease=self.lease,
                                                  spill=self.folder / SPILL_NAME)
                        if self.writes else dp.DiscardedMetrics())
        if self.writes:  # points an earlier segment left when its ledger went away
            self.metrics.adopt_spilled(self.step)
        for key, step, value, seen, wall in self._pending:
            self.metrics.log(key, step, float("nan") if value is None else value, seen, wall)
        self.signals.install()

    def _restore(self, source: Mapping[str, Any]) -> None:
        self.phase = "resume"
        tensors, state = shard_files.load(Path(source["path"]), source["sha256"], self.replica)
        if state.get("config_sha256") != self.record.config_sha256:
            raise ckpt.CheckpointError(f"checkpoint {source['path']} belongs to another config")
        self._trainer.restore_state(tensors, state)
        if self.writes and state.get("resharded_from", self.replica.world) != self.replica.world:
            self._event("resharded", f"segment {self.segment_ordinal}: resumed on "
                        f"{self.replica.world} ranks from shards of {state['resharded_from']}")
        self.rules.restore(state["stop_rules"])
        self.step, self.examples_seen = int(state["step"]), int(state["examples_seen"])
        self.replayed_from = self.step
        self._checkpointed = self.step  # the checkpoint restored from is this step's
        self._pending = state.get("metric_buffer", [])

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, name: str) -> None:
        """Every phase change tells a supervisor the run makes progress, and where it is."""
        self._phase = name
        progress_page.tick(name, self.step or None)  # before the restore: where it starts

    @property
    def _trainer(self) -> Trainer:
        if self.trainer is None:
            raise LoopError(f"run {self.run_id}: setup() has not built the trainer")
        return self.trainer

    def train(self) -> RunOutcome:
        traceback_artifact = None
        try:
            stop = self._loop()
        except LeaseLost:
            raise  # another worker may own the run now: write nothing more
        except torch.cuda.OutOfMemoryError as error:
            stop = StopDecision("oom", "out_of_memory", oom_detail(error, self.phase,
                                                                   self.phase_inputs))
        except (Exception, SystemExit, KeyboardInterrupt) as error:  # task code may raise these
            lost = self.rank_fault(self.step, self.phase) if self.rank_fault else None
            stop = lost or failure_decision(error, self.phase, self.step, self.run_id)
            traceback_artifact = self._save_traceback() if stop.status == "failed" else None
        return self._end(stop, traceback_artifact)

    def _loop(self) -> StopDecision:
        validation = self.config["validation"]
        checkpoint_every = self.config["loop"]["checkpoint_every"] or int(validation["every"])
        decided, at_start = None, None
        if self.replayed_from is not None:  # killed in its last update or while ending?
            decided, at_start = stop_at_resume(self.ledger, self.record.campaign, self.run_id,
                                               self.step, self.rules)
            self._resumed_stop = decided
        if at_start is not None:  # no update past it; at the budget, end on a validation
            if at_start.cause == "budget_reached" and not validated_at(
                self.ledger, self.record.campaign, self.run_id, self.step
            ):
                at_start = self._training(self._validate) or at_start
            return replace(at_start, phase=at_start.phase or "update")
        paused = self.rules.after_update(self.step) if self.rules.pause_at is not None else None
        if paused is not None and self.step >= self.rules.pause_at:  # resumed at its rung,
            return replace(paused, phase="update")  # still undecided: it waits, no update
        while True:
            stop = self._training(self._update)
            if stop is None and validates_after(self.step, validation):
                stop = self._training(self._validate)
            if stop is not None:
                return stop
            if self.step % checkpoint_every == 0:
                self.save_checkpoint()
            stop = self.rules.after_update(self.step)
            signalled = self.signals.received is not None
            if self.replica.world > 1:  # the ranks' one answer (a later signal: next update)
                stop, signalled = agree(stop, self.signals, self.heartbeat.lease_lost,
                                        self._group_device)
            self.heartbeat.check()
            if self.heartbeat.lease_lost.is_set():
                raise LeaseLost(f"run {self.run_id}: {LEASE_GONE}")
            if signalled and not (stop is not None and stop.detail.startswith(PAUSED)):
                return self.signals.decision()  # (a rung's pause at this step wins: same end)
            if decided is not None and decided.step == self.step:
                stop = decided  # resumed from before the decided stop: it holds at its step
            if stop is not None:
                if stop.cause == "budget_reached" and not validates_after(self.step, validation):
                    stop = self._training(self._validate) or stop  # end on a validation point
                return replace(stop, phase=stop.phase or "update")

    def _training(self, work: Callable[[], StopDecision | None]) -> StopDecision | None:
        """Run ``work`` (an update or a validation), adding its seconds to the training time."""
        started = time.perf_counter()
        try:
            return work()
        finally:
            self.training_s += time.perf_counter() - started

    def _measured(self) -> bool:
        return self.step < 2 or self.step % self.measure_every == 0

    def _update(self) -> StopDecision | None:
        """One update, top to bottom: batches, forward-backward, stop check, step, log."""
        trainer, measure, next_step = self._trainer, self._measured(), self.step + 1
        began = time.perf_counter()  # train/update_s: data to optimizer step, this update
        self.phase, self._batches = "data", []
        with self.probe.phase("data", measure=measure) as record:
            count, self._batches, waited = trainer.next_update()
            if record is not None:
                record.inputs = self.phase_inputs
        inputs = self.phase_inputs if measure else None
        self.phase = "forward"
        with (self.probe.phase("backward", inputs, measure=measure),
              task_metrics.collecting("train", self._gathered) as logged):
            loss_sum, units = trainer.forward_backward(self._batches)
        loss = loss_sum / units
        stop = self.rules.after_loss(loss)
        if stop is not None:  # the diverged curve keeps its last point
            self.metrics.log("train/loss", next_step, loss, self.examples_seen + count)
            return replace(stop, phase="forward", step=next_step)
        self.phase = "update"
        with self.probe.phase("update" if self.step else "update_first", inputs, measure=measure):
            grad_norm = trainer.gradient_norm()
            stop = None if trainer.scaler.is_enabled() else self.rules.after_gradients(grad_norm)
            if stop is not None:
                self.metrics.log("train/loss", next_step, loss, self.examples_seen)
                return replace(stop, phase="backward", step=next_step)
            used_lr = trainer.lr  # the rate this update steps with (the scheduler then moves)
            trainer.step()
        self.step, self.examples_seen = next_step, self.examples_seen + count
        values = {"train/loss": loss, "train/grad_norm": grad_norm, "train/units": float(units),
                  "train/data_wait_s": waited, "train/lr": used_lr,  # the rate it stepped with
                  "train/update_s": time.perf_counter() - began}
        values |= self._logged_by_task(logged)
        self.metrics.log_dict(self.step, values, self.examples_seen)
        self._write_phases(every_rank=True)
        return None

    @property
    def _gathered(self) -> list[str] | None:
        """On several ranks, the training keys the task declares (gathered every update);
        None on one rank, where any name is kept."""
        if self.replica.world == 1:
            return None
        return [k for k in task_metrics.declared_names(self._trainer.task)
                if k.startswith("train/")]

    def _logged_by_task(self, logged: task_metrics.Collected) -> dict[str, float]:
        """What the task logged in this update: over every rank's microbatches."""
        if self.replica.world == 1:
            return logged.means()
        if not logged.declared:  # declares none: nothing to gather, no collective
            return {}
        parts = dp.gather_json(logged.sums, self.replica, self._group_device)
        return task_metrics.combined(parts) if parts is not None else {}

    @property
    def phase_inputs(self) -> dict[str, Any]:
        """What the current phase works on (an update's shapes, longest length, microbatch;
        validation's batch), when a measurement or an out-of-memory report needs it."""
        trainer = self.trainer
        if self.phase == "validation" and trainer is not None:  # not the last update's shapes
            return {"validation_batch": trainer.val_batch, "examples": len(trainer.val_view)}
        return describe_inputs(self._batches, self.config["loop"]["microbatch"]) if (
            self._batches) else {}

    @torch.no_grad()
    def _validate(self) -> StopDecision | None:
        self.phase = "validation"
        trainer = self._trainer
        measure = self._measured() or not self._validated
        size = trainer.val_batch
        inputs = {"examples": len(trainer.val_view), "batch": size}
        with (self.probe.phase("validation", inputs, measure=measure),
              task_metrics.collecting("val") as logged):
            total, units, records = trainer.evaluate(trainer.val_view, size)
        self._validated = True
        with task_metrics.collecting("train_eval") as estimated:
            estimate = trainer.train_estimate()
        # Every rank validates on the whole set: rank 0's own values are the run's.
        scores = {**logged.means(), **estimated.means()}
        scores |= {f"val/{k}": float(v) for k, v in trainer.task.score(records).items()}
        scores |= {"val/loss": total / max(1, units), **estimate}
        self.metrics.log_dict(self.step, scores, self.examples_seen)
        self.metrics.flush()  # a validation point is a natural sync point: bound what a crash loses
        if self.writes:
            name = f"step-{self.step:08d}{self._segment_suffix}.parquet"
            path = write_predictions(self.folder / "predictions" / name, records)
            self.waiting.file("predictions", path, self.step, self.lease)
        self._write_phases(every_rank=True)
        stop = self.rules.after_validation(scores.get(self.config["validation"]["metric"]))
        return replace(stop, phase="validation") if stop is not None else None

    @property
    def _segment_suffix(self) -> str:
        """Files of later segments carry their ordinal: a resumed run never overwrites (and a
        stale worker never clobbers) another segment's file."""
        return "" if self.segment_ordinal <= 1 else f"-segment-{self.segment_ordinal}"

    def save_checkpoint(self) -> None:
        """Rank 0's checkpoint (every rank's shards in a sharded run, indexed in rank 0's)."""
        self.phase = "checkpoint"
        if not self.writes and self._trainer.sharding is None:
            return None
        if self.heartbeat.lease_lost.is_set():
            raise LeaseLost(f"run {self.run_id}: lease gone; no checkpoint written")
        self.metrics.flush()
        with self.probe.phase("checkpoint", {"step": self.step}, measure=self._measured()):
            tensors, state = self._trainer.capture_state(
                run_id=self.run_id,
                step=self.step,
                examples_seen=self.examples_seen,
                stop_rules=self.rules.state(),
                metric_buffer=self.metrics.pending_rows(),
                config_sha256=self.record.config_sha256,
            )
            name = f"step-{self.step:08d}{self._segment_suffix}.safetensors"
            saved = shard_files.save(self.folder / "checkpoints" / name, tensors, state,
                                     self.replica, self._group_device)
        if saved is None:  # another rank's shards: rank 0 records the checkpoint
            self._checkpointed = self.step
            return None
        self.waiting.file("checkpoint", saved.path, saved.step, self.lease, saved.sha256)
        self._checkpointed = saved.step
        end_if_away_too_long(self.metrics, saved.step)
        keep = int(self.config.get("checkpoint", {}).get("keep_last", 3))
        if not self.waiting.pending:  # never the recorded ones while newer wait for the ledger
            ckpt.prune(saved.path.parent, keep, saved.path)
        self._write_phases()

    def _event(self, kind: str, detail: str) -> None:
        self.ledger.add_event(self.record.campaign, kind, detail, run_id=self.run_id,
                              lease=self.lease)

    def _save_traceback(self) -> int | None:
        return save_traceback(self.ledger, self.run_id, self.folder, self.step,
                              lease=self.lease) if self.writes else None

    def _write_phases(self, every_rank: bool = False) -> None:
        """Record the measured phases; ``every_rank``: phases all replicas ran (updates,
        validation), which rank 0 gathers from every rank."""
        rows = [{**r.row(run_id=self.run_id), "inputs": r.inputs} for r in self.probe.drain()]
        if every_rank and self.replica.world > 1 and rows:
            rows = dp.rows_of_every_rank(rows, self.replica, self._group_device)
        if rows and self.writes:
            self.waiting.phases(rows, self.lease)

    def request_stop(self, signum: int) -> None:
        """Stop after the current update as if ``signum`` had arrived (checkpoint, interrupted)."""
        self.signals.request(signum)

    def cleanup(self) -> None:
        if self.replay is not None:  # the run ended before its final artifact: no replay
            self.replay.cancel()
        if self.trainer is not None:
            self.trainer.close()  # the loader's workers
        self.heartbeat.stop()
        self.signals.restore()


def execute(ledger: Ledger, run_id: str, *, artifacts: Path, **options: Any) -> RunOutcome:
    """Run (or resume) one run in this process: the four calls of a recipe."""
    loop = RunLoop(ledger, run_id, artifacts=artifacts, **options)
    try:
        loop.setup()
        return loop.train()
    finally:
        loop.cleanup()
