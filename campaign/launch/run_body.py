"""The run itself, in its supervised process (a child of the task host): the body the
supervisor (:mod:`campaign.launch.supervisor`) names for :mod:`campaign.launch.run_process`.
Only this side imports torch and the loop; the worker that placed the run does not."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from campaign.errors import LoopError, RunSetupFailed
from campaign.launch.kills import killed_end
from campaign.launch.replicated import Followers, RankLost, replica_group
from campaign.launch.worker import WorkerOptions, options_from
from campaign.ledger import Claim, Ledger, StopRecord
from campaign.loop import replicas as dp
from campaign.loop.outcome import RunOutcome
from campaign.loop.progress_page import Progress
from campaign.loop.resume import ResumePoint
from campaign.loop.run_files import record_log
from campaign.loop.stop import StopDecision
from campaign.loop.train import RunLoop
from campaign.search.pause import rung_pause


def supervised_body(
    options: dict[str, Any],
    worker: str,
    claim: dict[str, Any],
    point: dict[str, Any] | None,
    ledger: Ledger,
    log: Path,
) -> RunOutcome:
    """The run in its supervised process, from the JSON values the worker sent (options,
    claim and resume point as documents: nothing travels pickled)."""
    placed = options_from(options)
    if placed.threads:
        import torch

        torch.set_num_threads(placed.threads)
    resume_point = None if point is None else ResumePoint(**point)
    return _execute_here(ledger, placed, worker, Claim(**claim), resume_point, log)


def _execute_here(
    ledger: Ledger,
    options: WorkerOptions,
    worker: str,
    claim: Claim,
    point: ResumePoint | None,
    log: Path,
) -> RunOutcome:
    """The run itself, in the supervised child process (the parent holds the heartbeat)."""
    run_id = claim.run_id
    world = int(ledger.run(run_id).config_document["loop"]["replicas"])
    if options.ranks and claim.ordinal > 1:  # a resume may continue on another count
        world = options.ranks
    group: Any = contextlib.nullcontext()
    replica = None
    if world > 1:
        group = replica_group(ledger, run_id, world, options.device, options.artifacts)
        replica = dp.Replica(0, world)
    loop_options = {**_loop_options(options, worker), "heartbeat_s": None}
    try:
        loop = RunLoop(ledger, run_id, claim=claim, replica=replica, resume=point, log=log,
                       pause_at=rung_pause(ledger, ledger.run(run_id)), **loop_options)
    except LoopError as error:  # refused before any work: a claimed run must still end
        return _ended_untrained(ledger, claim, log, "failed", "exception", str(error), 0)
    try:
        with group as followers:
            if followers is not None:  # a rank lost mid-run: interrupted, as a kill is
                loop.rank_fault = _rank_fault(ledger, claim, followers)
            try:
                loop.setup()
            except RunSetupFailed as error:  # the run's end is recorded already
                loop.cleanup()
                cause = "exception" if error.status == "failed" else "interrupted"
                return RunOutcome(loop.run_id, error.status, cause, loop.step, str(error))
            try:
                return loop.train()
            finally:
                loop.cleanup()
    except RankLost as lost:  # the group never formed (raised only as it forms)
        return _ranks_lost(ledger, claim, log, str(lost))


def _rank_fault(ledger: Ledger, claim: Claim,
                followers: Followers) -> Callable[[int, str], StopDecision | None]:
    """How rank 0 ends a run whose collective failed: as a kill when another rank was lost
    (launch/kills.py: ``interrupted``/``killed``, the second at one update ``failed``), else
    None (the run's own error)."""

    def fault(step: int, phase: str) -> StopDecision | None:
        how = followers.lost()
        if how is None:
            return None
        status, detail = killed_end(ledger, claim, how, Progress(0, step, phase),
                                    subject="the run's")
        return StopDecision(status, "killed", detail)

    return fault


def _ranks_lost(ledger: Ledger, claim: Claim, log: Path, how: str) -> RunOutcome:
    """The end of a run whose other ranks never joined (killed as they started, or their Ray
    bundles left without a node): ``interrupted`` at the update it started from, nothing
    trained. Not a kill of the run (none is counted): its worker stops rather than retry at
    once, and a resume continues it once the cluster has room."""
    detail = (f"the run's other ranks did not join: {how}; `campaign resume {claim.run_id}` "
              "(or `campaign launch CAMPAIGN --resume-interrupted`) continues it from update "
              f"{claim.start_step}")
    return _ended_untrained(ledger, claim, log, "interrupted", "interrupted", detail,
                            claim.start_step)


def _ended_untrained(ledger: Ledger, claim: Claim, log: Path, status: str, cause: str,
                     detail: str, step: int) -> RunOutcome:
    """Record the end of a claimed run that stopped before its loop trained (a claimed run
    must still end): its log, then the end, in the setup phase."""
    record_log(ledger, claim.run_id, log, step, lease=claim.lease)
    ledger.finish(claim.run_id, status, StopRecord(cause, step, "setup", detail),
                  lease=claim.lease, training_s=0.0)
    return RunOutcome(claim.run_id, status, cause, step, detail)


def _loop_options(options: WorkerOptions, worker: str) -> dict[str, Any]:
    return {
        "artifacts": options.artifacts,
        "worker": worker,
        "device": options.device,
        "heartbeat_s": options.heartbeat_s,
        "replay_in_subprocess": options.replay_in_subprocess,
        "preempt_signals": options.preempt_signals,
    }
