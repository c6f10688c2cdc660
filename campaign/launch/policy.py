"""How a campaign is launched: where its workers may run, the pilot gate, and which executor
places them. ``campaign launch`` parses its options into a :class:`LaunchRequest` and calls
:func:`launch_campaign`; everything it decides lives here, not in the command."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from campaign.gates.launch_gate import GateDecision, open_gate
from campaign.launch.defaults import EXECUTORS
from campaign.launch.live_table import ProgressDisplay
from campaign.launch.local import DeviceError, LocalLauncher, plan_slots
from campaign.launch.worker import WorkerOptions
from campaign.ledger import Ledger
from campaign.ledger.locality import check_single_host
from campaign.ledger.progress import Snapshot

# A run that ended in one of these needs attention; diverged is a result, not an accident.
NEEDS_ATTENTION = ("failed", "oom", "interrupted", "lost")


class LaunchRefused(ValueError):
    """The launch as asked cannot work (bad devices, an executor that cannot see the ledger)."""


@dataclass(frozen=True)
class LaunchRequest:
    """Everything ``campaign launch`` was asked, executor options included."""

    options: WorkerOptions
    executor: str = "local"
    workers: int | None = None
    devices: str = "cpu"
    skip_reason: str | None = None
    address: str | None = None
    gpus_per_run: float | None = None
    schedule_timeout_s: float = 600
    ray_placement: str = "PACK"
    slurm_folder: Path | None = None
    slurm_partition: str | None = None
    slurm_time_min: int = 60
    slurm_signal_s: int = 120
    max_requeues: int = 3
    grace_s: float = 300


@dataclass(frozen=True)
class LaunchOutcome:
    gate: GateDecision
    snapshot: Snapshot
    interrupted: bool
    # What the workers' own stack checks refused (each worker checks in a host child).
    refusals: tuple[str, ...] = ()

    @property
    def attention(self) -> dict[str, int]:
        """Runs that ended in a way that needs a look (failed, oom, interrupted, lost)."""
        counts = self.snapshot.counts
        return {status: counts[status] for status in NEEDS_ATTENTION if counts.get(status)}

    @property
    def unfinished(self) -> bool:
        return bool(self.attention or self.snapshot.left or self.snapshot.counts.get("running"))


def launch_campaign(
    ledger: Ledger,
    url: str,
    request: LaunchRequest,
    display: ProgressDisplay | None = None,
    on_gate: Callable[[GateDecision], None] | None = None,
) -> LaunchOutcome:
    """Check where workers may run and the pilot gate, then place workers with the executor.

    ``on_gate`` hears the gate's decision (and its stack warnings) before any
    worker starts. Raises :class:`LaunchRefused` for a launch that cannot work and
    :class:`~campaign.gates.launch_gate.GateClosed` without a passing pilot (or a
    recorded decision to skip it).
    """
    campaign, options = request.options.campaign, request.options
    ledger.campaign(campaign)
    if request.executor not in EXECUTORS:
        raise LaunchRefused(f"unknown executor {request.executor!r}: {', '.join(EXECUTORS)}")
    address = request.address
    if request.executor == "ray":
        from campaign.launch.ray_executor import cluster_address

        address = cluster_address(address)
    if request.executor != "ray" or address is None:
        check_single_host(ledger, options.lease_s)
    elif ledger.dialect == "sqlite":
        raise LaunchRefused(
            "--executor ray on a cluster (--address or RAY_ADDRESS): workers on other hosts "
            "cannot share a SQLite ledger; "
            "use a PostgreSQL ledger (--ledger postgresql://USER@HOST/DB)"
        )
    local_slots = []
    if request.executor == "local":  # every refusal before the gate records anything
        try:
            local_slots = plan_slots(request.devices, request.workers)
        except DeviceError as error:
            raise LaunchRefused(str(error)) from None
        # The stack and device are checked by each worker in a child of the task host before
        # it claims (the launcher imports no torch; its workers share its one host).
    if request.executor == "slurm":
        _check_slurm_request(request)
    who = f"launch --executor {request.executor}"
    gate = open_gate(ledger, campaign, skip_reason=request.skip_reason, who=who,
                     check_stack=request.executor != "local")
    if on_gate is not None:  # said before any worker starts: a launch may take hours
        on_gate(gate)
    display = display or ProgressDisplay()
    if request.executor == "local":
        slots = local_slots
        launcher = LocalLauncher(url, options, slots, display=display, grace_s=request.grace_s)
        before = ledger.events(campaign)
        seen = int(before["id"].max()) if len(before) else 0
        result = launcher.run(ledger)
        events = ledger.events(campaign)
        refused = events[(events["kind"] == "stack_refused") & (events["id"] > seen)]
        return LaunchOutcome(gate, result.snapshot, result.interrupted,
                             tuple(dict.fromkeys(refused["detail"])))
    snapshot, interrupted = _on_engine(url, request, display)
    return LaunchOutcome(gate, snapshot, interrupted)


def _check_slurm_request(request: LaunchRequest) -> None:
    gpus = request.gpus_per_run
    if gpus is not None and gpus != int(gpus):
        raise LaunchRefused(f"--gpus-per-run {gpus:g}: a SLURM task asks for whole GPUs")
    if request.slurm_signal_s >= 60 * request.slurm_time_min:
        raise LaunchRefused(
            f"--slurm-signal-s {request.slurm_signal_s} is not shorter than --slurm-time-min "
            f"{request.slurm_time_min} (minutes): every task would be told of its time limit "
            "at once"
        )


def _on_engine(url: str, request: LaunchRequest, display: ProgressDisplay) -> tuple[Snapshot, bool]:
    """Launch on Ray or SLURM (imported only when asked for: both are optional extras)."""
    if request.executor == "ray":
        from campaign.launch.ray_executor import RayOptions, launch_on_ray

        ray_options = RayOptions(
            address=request.address, workers=request.workers, devices=request.devices,
            gpus_per_run=request.gpus_per_run, schedule_timeout_s=request.schedule_timeout_s,
            grace_s=request.grace_s, placement=request.ray_placement,
            ranks=_most_ranks(url, request.options.campaign, request.options.ranks),
        )
        return launch_on_ray(url, request.options, ray_options, display)
    from campaign.launch.slurm_executor import SlurmOptions, launch_on_slurm

    gpus = request.gpus_per_run
    gpus = int(gpus) if gpus is not None else int(request.devices.startswith("cuda"))
    slurm_options = SlurmOptions(
        folder=request.slurm_folder or request.options.artifacts / "slurm",
        workers=request.workers or 1, partition=request.slurm_partition,
        time_min=request.slurm_time_min, max_requeues=request.max_requeues,
        gpus_per_task=gpus, cpus_per_task=request.options.threads or 1,
        signal_s=request.slurm_signal_s, grace_s=request.grace_s,
        ranks=_most_ranks(url, request.options.campaign, request.options.ranks),
    )
    return launch_on_slurm(url, request.options, slurm_options, display)


def _most_ranks(url: str, campaign: str, ranks: int | None) -> int:
    """The most ranks a run of ``campaign`` can take (its largest ``loop.replicas``, or
    ``--ranks``): the tasks each SLURM array task asks for, the bundles of each Ray worker
    task's placement group."""
    with Ledger.open(url) as ledger:
        configs = ledger.runs(campaign)["config"]
    most = max((int(c["loop"]["replicas"]) for c in configs if "loop" in c), default=1)
    return max(most, ranks or 1)
