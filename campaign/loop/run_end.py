"""How a run ends: the last checkpoint, the final artifact and its replay check, then the end
recorded (docs/runs.md). Split from :mod:`campaign.loop.train`, whose :class:`RunLoop` it is
part of; a sharded run's other ranks take their part of the checkpoint and of the artifact's
gathers here too, as rank 0 takes them.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

from campaign.errors import LeaseLost
from campaign.ledger import StopRecord
from campaign.ledger.canonical import canonical_json
from campaign.loop import replicas as dp
from campaign.loop.decisions import final_recorded, record_stop
from campaign.loop.outcome import RunOutcome
from campaign.loop.replay import write_final
from campaign.loop.resume import replayed_steps_report
from campaign.loop.run_files import record_file, record_log
from campaign.loop.stop import StopDecision, failure_decision
from campaign.stack.software import late_inputs

ENDS_WITH_CHECKPOINT = ("interrupted", "completed", "stopped")
ENDS_WITH_ARTIFACT = ("completed", "stopped")


class RunEnd:
    """The ending half of :class:`campaign.loop.train.RunLoop` (its attributes are the loop's)."""

    # Set by RunLoop; declared for readers of this half.
    writes: bool
    step: int
    replica: dp.Replica
    _checkpointed: int | None

    def _end_sharded(self, stop: StopDecision) -> None:
        """A sharded run's rank > 0: its shards of the last checkpoint and its share of the
        final artifact's gathers, where rank 0 takes them (the same stop on every rank)."""
        if stop.status in ENDS_WITH_CHECKPOINT and self._checkpointed != self.step:
            self.save_checkpoint()  # type: ignore[attr-defined]
        if stop.status in ENDS_WITH_ARTIFACT:
            self._export()

    def _end(self, stop: StopDecision, traceback_artifact: int | None) -> RunOutcome:
        """Checkpoint/export as the stop asks, then record the end. The heartbeat keeps going
        until the end is recorded: exporting and the replay check may take a while."""
        if not self.writes:
            if self._trainer.sharding is not None:  # its shards, and its part of the gathers
                self._end_sharded(stop)
            self.probe.drain()
            return RunOutcome(self.run_id, stop.status, stop.cause, self.step, stop.detail)
        phase = stop.phase or self.phase
        try:
            if (stop.status in ("completed", "stopped") and stop.cause != "budget_reached"
                    and stop != self._resumed_stop):
                step = self.step if stop.step is None else stop.step
                record_stop(self.ledger, self.record.campaign, self.run_id,
                            replace(stop, phase=phase), step, self.lease)
            # the loop may have saved this update already; a kill (a rank lost) left the
            # state mid-update, or the group without a rank: it resumes from the last one
            if (stop.status in ENDS_WITH_CHECKPOINT and stop.cause != "killed"
                    and self._checkpointed != self.step):
                self.save_checkpoint()
            if stop.status in ENDS_WITH_ARTIFACT:
                self._export()
        except LeaseLost:
            raise
        except Exception as error:  # a failure while ending still ends the run, as failed
            stop = failure_decision(error, self.phase, self.step, self.run_id, ending=stop.cause)
        with contextlib.suppress(Exception):
            self.metrics.close()
        self.waiting.flush(self.lease)  # a resume trusts only the checkpoints recorded
        self.metrics.write_spilled()  # points close() left in the run folder: before the end
        self._record_replayed_steps()
        if late := late_inputs(self.stack, [self.artifacts]):  # a lazy dataset's files, say
            self._event("inputs_late", canonical_json(late))
        if self.log is not None:  # before the end: nothing is added to an ended run
            record_log(self.ledger, self.run_id, self.log, self.step, lease=self.lease)
        detail = stop.detail + (f" (traceback: artifact {traceback_artifact})"
                                if traceback_artifact else "")
        step = self.step if stop.step is None else stop.step
        ended = StopRecord(stop.cause, step, phase, detail)
        self.ledger.finish(self.run_id, stop.status, ended, lease=self.lease,
                           training_s=round(self.training_s, 4))
        self.heartbeat.stop()
        return RunOutcome(self.run_id, stop.status, stop.cause, self.step, detail)

    def _export(self) -> None:
        """Write and record the final artifact once: a resume finding it (verified) completes
        from it and never rewrites it, so an archive that holds its hash stays valid."""
        self.phase = "export"
        trainer = self._trainer
        write = self.replayed_from is None or not final_recorded(
            self.ledger, self.record.campaign, self.run_id, self.step, self.artifacts)
        if trainer.sharding is not None:  # every rank takes part in writing it, or none
            write = dp.broadcast_json(write, self.replica, self._group_device)
        if write:
            path = self.folder / f"final{self._segment_suffix}.safetensors"
            with self.probe.phase("export", {"step": self.step}):
                stack = canonical_json(self.stack)  # the code this segment imported and ran
                write_final(path, trainer.model, trainer.task, self.record.config, stack,
                            self.device, self.replica if trainer.sharding else None,
                            trainer.base)
            if not self.writes:
                return
            record_file(self.ledger, self.run_id, "final", path, self.step, lease=self.lease)
            self._write_phases()
        if self.replay is not None:
            problem = self.replay.result()
            if problem is not None:  # "was interrupted": a flag of its own, not replay_differs
                how = "was interrupted" if problem.how == "interrupted" else "failed"
                self._event("replay", f"replay of the final artifact in a fresh process {how}: "
                            f"{problem.why}")

    def _record_replayed_steps(self) -> None:
        if self.replayed_from is not None and self.segment_id is not None and (
                report := replayed_steps_report(self.ledger, self.run_id, self.segment_id)):
            self._event("determinism_check", report)
