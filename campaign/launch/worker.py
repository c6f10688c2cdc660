"""One worker: claim a run from the ledger, execute it, record it, repeat until none is left.

Any number of workers on any number of machines may share one PostgreSQL
ledger (claims are atomic, see :mod:`campaign.ledger.claims`). Before each
claim a worker sweeps runs whose heartbeat is older than the lease limit and
declares them ``lost``; with ``resume`` statuses it continues such runs from
their last verified checkpoint before taking planned ones, and (resuming
``lost``) stays while other runs are running, so that the run of a worker that
died is continued by a live one.

SIGTERM/SIGINT: the running run checkpoints and ends ``interrupted`` (the
loop's own handler), and the worker claims nothing more. A worker whose lease
was taken away (it was paused or cut off past the limit) stops at once and
exits with :class:`LeaseLost`: another worker owns its run now.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from campaign.errors import (
    RESUME_REFUSED,
    CheckpointError,
    RunRefused,
    StackRefused,
)
from campaign.gates.launch_gate import stack_warnings
from campaign.gates.stack_gate import unfit_problems
from campaign.host import calls
from campaign.launch import search_work
from campaign.launch.defaults import DEFAULT_HEARTBEAT_S, DEFAULT_LEASE_S, RUN_PRELOAD
from campaign.launch.pending_ends import settle_pending_ends
from campaign.launch.supervisor import Supervision, supervise
from campaign.ledger import Claim, IllegalTransition, Ledger
from campaign.ledger.writable import refuse_if_unwritable
from campaign.loop.outcome import RunOutcome
from campaign.loop.resume import choose_resume_point


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker behaves; ``lease_s`` is the heartbeat age after which a run is lost."""

    campaign: str
    artifacts: Path
    device: str = "cpu"
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    lease_s: float = DEFAULT_LEASE_S
    resume: tuple[str, ...] = ()  # statuses to continue: "lost", "interrupted"
    max_runs: int | None = None
    threads: int | None = None
    name: str | None = None
    replay_in_subprocess: bool = True
    # Signals by which a scheduler announces preemption or a time limit (SLURM: USR2):
    # the run checkpoints and ends interrupted with stop cause ``preempted``.
    preempt_signals: tuple[int, ...] = ()
    # Continue runs that a preemption or a kill nobody of ours sent interrupted (a SLURM array
    # task does: the run goes on wherever a slot is free), before planned ones.
    resume_preempted: bool = False
    # Each run executes in a supervised child process (campaign/launch/supervisor.py);
    # ``grace_s``: between a graceful signal to it (wall time, SIGTERM) and the kill.
    grace_s: float = 30.0
    # A launched worker (the launcher opened the gate): who it is in the record of how its
    # stack differs from the passing pilots' (``"launch worker"``); None compares nothing.
    compare_stack_as: str | None = None
    # The ranks a resumed run continues on (None: its loop.replicas); its first segment
    # always takes its loop.replicas (docs/runs.md, "Sharded runs").
    ranks: int | None = None

    def __post_init__(self) -> None:
        if not (self.heartbeat_s >= 0.1 and self.lease_s >= 3 * self.heartbeat_s):
            raise ValueError(
                f"the heartbeat interval ({self.heartbeat_s:g} s) must be at least 0.1 s and "
                f"the lease limit ({self.lease_s:g} s) at least 3 heartbeats: a run would be "
                "declared lost between two beats of a live worker"
            )
        if self.grace_s <= 0:
            raise ValueError(f"the grace period ({self.grace_s:g} s) must be positive")


@dataclass
class WorkerReport:
    """What one worker did: one outcome per run it executed."""

    worker: str
    outcomes: list[RunOutcome] = field(default_factory=list)
    lost_marked: list[str] = field(default_factory=list)
    # Resumable runs left as they were: no recorded checkpoint verifies (the reasons).
    not_resumed: dict[str, str] = field(default_factory=dict)
    stopped_by_signal: bool = False
    preempted: bool = False
    signal_name: str | None = None  # the stop signal that came, if one did


def worker_name(device: str, name: str | None = None, pid: int | None = None) -> str:
    """host:pid:device, the identity written with every claim and segment."""
    return name or f"{socket.gethostname()}:{pid or os.getpid()}:{device}"


def refuse_unfit_stack(ledger: Ledger, campaign: str, device: str, *,
                       meanwhile: Callable[[], None] | None = None,
                       compare_as: str | None = None,
                       on_warning: Callable[[str], None] | None = None,
                       ranks: int | None = None) -> None:
    """Raise :class:`StackRefused` naming what this stack misses, before any claim.
    ``meanwhile``: work done while the check's child of the task host runs (a worker's host
    imports the run's modules while that child imports the task's). ``compare_as`` (a
    launched worker, ``"launch worker"``): also compare this stack with the passing pilots'
    and tell each difference to ``on_warning`` (before a refusal: a difference may be why),
    recorded once each (``stack_difference`` events).

    Both are read and asked in one child of the task host, which has torch and pandas
    imported: this process imports neither (pandas was 0.7 s of a launched worker's start;
    the comparison was a child of its own)."""
    task = ledger.campaign(campaign).task
    what = "checking the software stack and the device"
    if "torch" in sys.modules:  # this process can ask torch itself
        found = stack_check(ledger, campaign, device, compare_as, ranks)
        if meanwhile is not None:
            meanwhile()
    else:
        url = ledger.engine.url.render_as_string(hide_password=False)
        checking = calls.begin(stack_check_at, url, campaign, device, compare_as, ranks, task=task,
                               what=what)
        try:
            if meanwhile is not None:
                meanwhile()
            found = checking.result()
        finally:
            checking.cancel()
    for warning in found["warnings"]:
        if on_warning is not None:
            on_warning(warning)
    if found["problems"]:
        raise StackRefused(f"worker on {device} refuses to claim runs of {campaign!r}: "
                           + "; ".join(found["problems"]))


def refuse_unfit_run(ledger: Ledger, run_id: str, device: str,
                     ranks: int | None = None) -> None:
    """Before ``run`` or ``resume`` claims or changes ``run_id``: raise :class:`RunRefused`
    naming what ``device`` and this stack miss for it (the device itself, the task's declared
    requirements, the run's precision), as a worker refuses before its first claim. Asked
    where torch is: here when this process has it, else in a child of the task host."""
    record = ledger.run(run_id)
    task = ledger.campaign(record.campaign).task
    precision = record.config_document["loop"]["precision"]
    world = ranks if ranks and record.status != "planned" else record.config_document["loop"][
        "replicas"]
    problems = calls.with_torch(unfit_problems, task, device, [precision], [world], task=task,
                                what="checking the device and the software stack")
    if problems:
        raise RunRefused(f"run {run_id} stays {record.status}: on {device}: "
                         + "; ".join(problems))


def stack_check(ledger: Ledger, campaign: str, device: str,
                compare_as: str | None, ranks: int | None = None) -> dict[str, list[str]]:
    """What :func:`refuse_unfit_stack` asks, where torch is: this stack's problems for the
    waiting runs' precisions, and (``compare_as``) its differences from the pilots'."""
    runs = ledger.runs(campaign)
    waiting = runs[runs["status"].isin(("planned", "interrupted", "lost"))]
    precisions = sorted({c["loop"]["precision"] for c in waiting["config"] if "loop" in c})
    worlds = sorted({ranks if ranks and status != "planned" else int(c["loop"]["replicas"])
                     for c, status in zip(waiting["config"], waiting["status"], strict=True)
                     if "loop" in c})  # a resumed run takes --ranks when given
    problems = unfit_problems(ledger.campaign(campaign).task, device, precisions, worlds)
    warnings = [] if compare_as is None else list(
        stack_warnings(ledger, campaign, None, who=compare_as))
    return {"problems": problems, "warnings": warnings}


def stack_check_at(url: str, campaign: str, device: str, compare_as: str | None,
                   ranks: int | None = None) -> dict[str, list[str]]:
    """:func:`stack_check` on the ledger at ``url``, in a child of the task host."""
    with Ledger.open(url) as ledger:
        return stack_check(ledger, campaign, device, compare_as, ranks)


def run_worker(
    ledger: Ledger,
    options: WorkerOptions,
    *,
    on_outcome: Callable[[RunOutcome], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> WorkerReport:
    """Claim and execute runs of ``options.campaign`` until none is left (or a signal).

    A worker whose stack misses what the task declares, or whose device cannot run a
    precision the campaign's runs use, refuses to claim (:class:`StackRefused`). With
    ``options.compare_stack_as``, each difference from the pilots' stack goes to
    ``on_warning`` before the first claim.
    """
    report = WorkerReport(worker_name(options.device, options.name))
    task = ledger.campaign(options.campaign).task
    try:
        refuse_unfit_stack(ledger, options.campaign, options.device,
                           meanwhile=lambda: warm_up(task), compare_as=options.compare_stack_as,
                           on_warning=on_warning, ranks=options.ranks)
    except StackRefused as refused:  # recorded: a launcher that placed it says why
        ledger.add_event(options.campaign, "stack_refused", f"{report.worker}: {refused}")
        raise
    gated: set[str] = set()  # planned runs whose gate was checked (by the launch, then here)
    searching = search_work.is_search(ledger, options.campaign)
    with _stop_on_signals(options.preempt_signals) as stopping:
        while not stopping.is_set():
            if options.max_runs is not None and len(report.outcomes) >= options.max_runs:
                break
            settle_pending_ends(ledger, options.artifacts, options.campaign)  # before a sweep
            report.lost_marked += [
                lost.run_id for lost in ledger.mark_lost(options.lease_s, options.campaign)
            ]
            outlook = search_work.look(ledger, options.campaign) if searching else None
            taken = _next_run(ledger, options, report.worker, gated, set(report.not_resumed),
                              outlook)
            if taken is None and outlook is not None and not outlook["finished"]:
                outlook = search_work.look(ledger, options.campaign)  # a run may have paused
                taken = _next_run(ledger, options, report.worker, gated,  # since the last look
                                  set(report.not_resumed), outlook)
            if taken is None:
                if _may_be_lost(ledger, options) and not stopping.wait(options.heartbeat_s):
                    continue  # a run still running may yet be lost: this worker resumes it
                if (outlook is not None and not outlook["finished"] and _others_running(
                        ledger, options.campaign) and not stopping.wait(SEARCH_POLL_S)):
                    continue  # the search's next step waits on runs other workers run
                break
            try:
                outcome = _execute(ledger, options, report.worker, *taken, stopping)
            except CheckpointError as refused:  # before the run left its status: it stays
                report.not_resumed[taken[0]] = str(refused)
                continue
            if outcome is None:  # another worker resumed it first
                continue
            report.outcomes.append(outcome)
            if on_outcome is not None:
                on_outcome(outcome)
            if outcome.status == "interrupted" and RESUME_REFUSED in outcome.detail:
                report.not_resumed[taken[0]] = outcome.detail  # it waits; the others go on
            elif outcome.status == "interrupted" and outcome.cause not in (
                    "killed", "ledger_unreachable") and not search_work.is_paused(
                        {"stop_detail": outcome.detail}):  # a search's rung: the worker goes on
                stopping.set()  # a signal, a full volume, an outage: the next run would meet it
            # A run killed from outside (the OOM killer) is that run's event: the worker goes on
            # (docs/runs.md, faults), and may resume it like a preempted run.
        report.stopped_by_signal = stopping.is_set()
        if stopping.signalled:
            report.signal_name = signal.Signals(stopping.signum).name
        # Preempted whether the signal reached a run or came between two (the supervisor
        # records the signal it forwarded in the stop request).
        report.preempted = stopping.is_set() and stopping.signum in options.preempt_signals
    return report


def _may_be_lost(ledger: Ledger, options: WorkerOptions) -> bool:
    """With ``lost`` among the statuses to resume, a worker with nothing to claim stays while
    a running run has missed two heartbeats: its worker may have died (a node crash), and once
    its lease expires a live worker continues it instead of leaving it for the next launch.
    Runs that beat on time keep no worker waiting (on a cluster, an idle allocation)."""
    if "lost" not in options.resume:
        return False
    from campaign.ledger.progress import take_snapshot

    silent = 2 * options.heartbeat_s
    return any(run.heartbeat_age_s is not None and run.heartbeat_age_s > silent
               for run in take_snapshot(ledger, options.campaign).running)


def warm_up(task_reference: str) -> None:
    """Before a worker claims a run: its task host started and ready (torch and the built-in
    task's preloads imported), so a run's first heartbeat never waits for it."""
    probe = calls.start(os.getpid, [], follow=os.getpid(), task=task_reference,
                        preload=RUN_PRELOAD)
    probe.join()


TUPLE_FIELDS = ("resume", "preempt_signals")


def options_document(options: WorkerOptions, **overrides: Any) -> dict[str, Any]:
    """Worker options as plain JSON values, for the run's process or an engine's task (never
    pickled)."""
    return {**asdict(options), "artifacts": str(options.artifacts), **overrides}


def options_from(document: dict[str, Any], **overrides: Any) -> WorkerOptions:
    values = {**document, **overrides, "artifacts": Path(document["artifacts"])}
    for name in TUPLE_FIELDS:
        values[name] = tuple(values.get(name) or ())
    return WorkerOptions(**values)


def _others_running(ledger: Ledger, campaign: str) -> bool:
    return bool(ledger.run_rows(campaign, status=["running"]))


SEARCH_POLL_S = 1.0  # how often an idle worker of a search looks for its next step


def _next_run(
    ledger: Ledger, options: WorkerOptions, worker: str, gated: set[str], refused: set[str],
    outlook: dict[str, Any] | None = None,
) -> tuple[str, Claim | None] | None:
    """The next run this worker should execute (with its claim when it is already taken),
    or None when none is left.

    Resumable runs first (when asked), then the oldest planned run, claimed
    atomically. A resumable run is taken by the loop's own compare-and-set
    start, so two workers racing for it cannot both win.
    """
    refuse_if_unwritable(ledger.engine.url)  # a full or read-only ledger file: claim nothing
    resumable: list[tuple[str, str | None]] = [(status, None) for status in options.resume]
    if options.resume_preempted:  # (status, stop cause) to look for, in this order
        resumable[:0] = [("interrupted", "preempted"), ("interrupted", "killed"),
                         ("interrupted", "ledger_unreachable")]
    for run_id in (outlook or {}).get("continuing", []):  # kept at a search's rung
        if run_id not in refused:
            return run_id, None
    for status, cause in resumable:
        for run_id in _candidates(ledger, options, (status,), cause):
            if run_id not in refused:
                return run_id, None
    _refuse_ungated_newcomers(ledger, options.campaign, gated, None if outlook is None else (
        lambda ids: search_work.pilot_new_classes(ledger, options.campaign,
                                                  str(options.artifacts.absolute()),
                                                  options.device, ids)))
    claim = ledger.claim_next(options.campaign, worker)
    return None if claim is None else (claim.run_id, claim)


def _refuse_ungated_newcomers(ledger: Ledger, campaign: str, gated: set[str],
                              pilot: Callable[[list[str]], None] | None = None) -> None:
    """A run planned while workers run (a relaunch with a wider model) is gated like the rest:
    before a claim, the planned runs this worker has not seen pass their class's gate, or the
    worker stops (:class:`~campaign.gates.launch_gate.GateClosed`, naming the class). A
    search's proposals bring their own classes: ``pilot`` pilots those first."""
    from campaign.gates.launch_gate import open_gate

    _, rows = ledger.progress_rows(campaign)  # plain rows: a cheap query before each claim
    planned = {row["id"] for row in rows if row["status"] == "planned"}
    newcomers = sorted(planned - gated)
    if pilot is not None and newcomers:
        pilot(newcomers)
    elif gated and newcomers:  # the first look was the launch's (or the worker's own) gate
        open_gate(ledger, campaign, run_ids=newcomers, check_stack=False)
    gated |= planned


def _candidates(
    ledger: Ledger, options: WorkerOptions, statuses: Sequence[str], cause: str | None = None
) -> Iterator[str]:
    """The runs in ``statuses`` (with ``cause``, when given) in run order, read as plain rows:
    a worker that looks for runs to resume (a SLURM array task always does) imports no pandas
    until it finds one."""
    for row in ledger.run_rows(options.campaign, status=list(statuses)):
        if (cause is None or row["stop_cause"] == cause) and not search_work.is_paused(row):
            yield str(row["run_id"])


def _execute(
    ledger: Ledger,
    options: WorkerOptions,
    worker: str,
    run_id: str,
    claim: Claim | None,
    stopping: StopRequest,
) -> RunOutcome | None:
    """Execute one run, supervised in a child process; None
    when a resumable run was taken by another worker first. A resumable run's checkpoint is
    chosen and verified before it is taken (:class:`CheckpointError`: nothing changed)."""
    record = ledger.run(run_id)
    point = None
    if claim is None:
        point = choose_resume_point(ledger, record.campaign, run_id, record.config_sha256,
                                    options.artifacts)
        checkpoint = point.checkpoint
        try:
            claim = ledger.start(run_id, worker,
                                 start_step=checkpoint["step"] if checkpoint else 0,
                                 resumed_from=checkpoint["id"] if checkpoint else None)
        except IllegalTransition:  # another worker took it between list and start
            return None

    placed = replace(options, artifacts=options.artifacts.absolute())
    body = ("campaign.launch.run_body:supervised_body",
            [options_document(placed), worker, asdict(claim), None if point is None else
             asdict(point)])
    supervision = Supervision(options.heartbeat_s, options.grace_s)
    return supervise(ledger, claim, body, supervision, folder=options.artifacts / run_id,
                     config=record.config_document, stopping=stopping,
                     task=ledger.campaign(record.campaign).task)


def execute_one(ledger: Ledger, run_id: str, options: WorkerOptions) -> RunOutcome:
    """``campaign run`` / ``campaign resume``: one run, supervised, in this process's child.
    A planned run is taken here; a resumable one after its checkpoint verifies."""
    worker = worker_name(options.device, options.name)
    refuse_if_unwritable(ledger.engine.url)  # before the run leaves its status
    search_work.refuse_undecided(ledger, run_id)
    claim = ledger.start(run_id, worker) if ledger.run(run_id).status == "planned" else None
    with _stop_on_signals() as stopping:
        outcome = _execute(ledger, options, worker, run_id, claim, stopping)
    if outcome is None:
        raise IllegalTransition(f"run {run_id} was taken by another worker first")
    return outcome


class StopRequest(threading.Event):
    """Set by a signal (:meth:`by`), or by the worker itself after a run's interruption;
    remembers which signal, if one came."""

    signum: int = signal.SIGTERM
    signalled: bool = False

    def by(self, signum: int) -> None:
        self.signum, self.signalled = signum, True
        self.set()


@contextlib.contextmanager
def _stop_on_signals(extra: Sequence[int] = ()) -> Iterator[StopRequest]:
    """Between runs, SIGTERM/SIGINT only stop further claims (the loop handles them in a run)."""
    stopping = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stopping
        return

    def handler(signum: int, _frame: Any) -> None:
        stopping.by(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT, *extra)}
    try:
        yield stopping
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
