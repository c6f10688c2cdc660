"""The local executor: one worker process per device slot, watched until the work is done.

Each slot is a ``campaign worker`` process (the same command a user starts
by hand on another machine). The workers share the launcher's task host
(``CAMPAIGN_SHARED_HOST``): torch and the loop import once, not once per
worker, and every run forks from that host. A worker that dies takes
nothing else with it (its runs die with it, the host kills them as it would
its own), and ``kill -9`` of one is an ordinary event: the launcher reaps it,
declares its run ``lost`` at once (it saw the process end), and starts a
replacement while planned work remains. CUDA slots get
``CUDA_VISIBLE_DEVICES`` pinned to their device; CPU slots divide the
machine's cores between them (``--threads`` / ``OMP_NUM_THREADS``).

SIGTERM/SIGINT to the launcher is forwarded to every worker: running runs
checkpoint and end ``interrupted``; nothing is left ``running``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from campaign.errors import LedgerUnreachable
from campaign.host.calls import with_torch
from campaign.host.client import SHARED_HOST, share_path
from campaign.launch.live_table import ProgressDisplay
from campaign.launch.worker import WorkerOptions, worker_name
from campaign.launch.worker_command import worker_command
from campaign.ledger import Ledger
from campaign.ledger.location import ENV_VAR
from campaign.ledger.outage import came_back
from campaign.ledger.progress import Snapshot, take_snapshot
from campaign.stack.devices import cuda_device_count

MAX_RESPAWNS = 3


class DeviceError(ValueError):
    """A --devices value that names no usable device."""


@dataclass(frozen=True)
class Slot:
    """Where one worker process runs: its torch device and its environment pins."""

    device: str  # what the worker passes to torch (cuda:0 inside a pinned process)
    label: str  # what the user asked for (cuda:3, cpu)
    env: dict[str, str] = field(default_factory=dict)
    threads: int | None = None


def plan_slots(devices: str, workers: int | None) -> list[Slot]:
    """Slots for ``--devices`` (``cpu``, ``cuda``, ``cuda:0,cuda:1``) and ``--workers``."""
    names = [d.strip() for d in devices.split(",") if d.strip()]
    if not names:
        raise DeviceError("--devices names no device")
    if names == ["cpu"]:
        count = workers or 1
        threads = max(1, (os.cpu_count() or 1) // count)
        env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        return [Slot("cpu", "cpu", env, threads) for _ in range(count)]
    indices = _cuda_indices(names)
    count = workers or len(indices)
    return [
        Slot("cuda:0", f"cuda:{i}", {"CUDA_VISIBLE_DEVICES": str(i)})
        for i in (indices[k % len(indices)] for k in range(count))
    ]


def _cuda_indices(names: Sequence[str]) -> list[int]:
    # torch counts the devices in a child of the task host: the launcher imports no torch
    available = int(with_torch(cuda_device_count, what="counting CUDA devices"))
    if names == ["cuda"]:
        if not available:
            raise DeviceError("--devices cuda: no CUDA device is visible on this machine")
        return list(range(available))
    indices = []
    for name in names:
        kind, _, index = name.partition(":")
        if kind != "cuda" or not index.isdigit():
            raise DeviceError(f"--devices: {name!r} is not cpu, cuda or cuda:N")
        if int(index) >= available:
            raise DeviceError(
                f"--devices: {name} does not exist here ({available} CUDA device(s) visible)"
            )
        indices.append(int(index))
    return indices


@dataclass
class _Worker:
    slot: Slot
    process: subprocess.Popen[bytes]
    respawns: int = 0

    @property
    def name(self) -> str:
        return worker_name(self.slot.device, pid=self.process.pid)


@dataclass
class LaunchResult:
    snapshot: Snapshot
    interrupted: bool
    exit_codes: list[int]
    lost: list[str]


class LocalLauncher:
    """Start, watch and stop the worker processes of one campaign on this machine."""

    def __init__(
        self,
        url: str,
        options: WorkerOptions,
        slots: Sequence[Slot],
        *,
        display: ProgressDisplay | None = None,
        poll_s: float = 1.0,
        grace_s: float = 300.0,
    ) -> None:
        self.url = url
        self.options = options
        self.slots = list(slots)
        self.display = display or ProgressDisplay()
        self.poll_s = poll_s
        self.grace_s = grace_s
        self._stopping = threading.Event()
        self._lost: list[str] = []

    def command(self, slot: Slot) -> list[str]:
        return worker_command(self.options, slot.device, slot.threads)

    def _spawn(self, slot: Slot, respawns: int = 0) -> _Worker:
        # The ledger URL travels in the environment: a password never appears on a command line.
        # The workers join this process's task host: torch imports once for all of them.
        env = {**os.environ, **slot.env, ENV_VAR: self.url}
        shared = share_path()  # None: this process's host is not its own to share
        if shared is not None:
            env[SHARED_HOST] = shared
        process = subprocess.Popen(self.command(slot), env=env)
        return _Worker(slot, process, respawns)

    def run(self, ledger: Ledger) -> LaunchResult:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        workers = [self._spawn(slot) for slot in self.slots]
        finished: list[int] = []
        forwarded_at: float | None = None
        # Its own reads give up at once in an outage: the workers ride it out (and stop at
        # their limit), the launcher keeps watching them and answering signals meanwhile.
        quick, away = ledger.impatient(), None
        try:
            while workers:
                for worker in list(workers):
                    code = worker.process.poll()
                    if code is None:
                        continue
                    workers.remove(worker)
                    finished.append(code)
                    if code < 0:  # killed by a signal it could not handle: its run is lost
                        self._lost += [
                            lost.run_id
                            for lost in ledger.mark_lost(
                                self.options.lease_s, self.options.campaign, [worker.name]
                            )
                        ]
                        if (
                            not self._stopping.is_set()
                            and worker.respawns < MAX_RESPAWNS
                            and self._work_left(ledger)
                        ):
                            workers.append(self._spawn(worker.slot, worker.respawns + 1))
                if self._stopping.is_set():
                    if forwarded_at is None:
                        forwarded_at = time.monotonic()
                        for worker in workers:
                            worker.process.send_signal(signal.SIGTERM)
                    elif time.monotonic() - forwarded_at > self.grace_s:
                        for worker in workers:
                            worker.process.kill()
                if away is not None:  # (maybe) back: no heartbeat is judged for a lease
                    came_back()
                try:
                    self._lost += [
                        lost.run_id
                        for lost in quick.mark_lost(self.options.lease_s, self.options.campaign)
                    ]
                    self.display.show(take_snapshot(quick, self.options.campaign,
                                                    len(self.slots)))
                    away = None
                except LedgerUnreachable as error:
                    away = error
                if workers:
                    time.sleep(self.poll_s)
            if away is not None:  # still away when the last worker ended (they gave up on it
                quick.campaign(self.options.campaign)  # past the limit): so does the launch
        finally:
            for worker in workers:  # an exception in the launcher must not orphan workers
                if worker.process.poll() is None:
                    worker.process.send_signal(signal.SIGTERM)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        snapshot = self._until_others_end(ledger)
        self.display.show(snapshot)
        self.display.close()
        return LaunchResult(snapshot, self._stopping.is_set(), finished, self._lost)

    def _until_others_end(self, ledger: Ledger) -> Snapshot:
        """Our workers found nothing more to claim, but runs may still be running under
        another launcher's workers: wait for their end (or for the lease rule to declare them
        lost), so the exit code speaks of every run, not only of those this launcher ran."""
        snapshot = take_snapshot(ledger, self.options.campaign, len(self.slots))
        while snapshot.running and not self._stopping.is_set():
            time.sleep(self.poll_s)
            swept = ledger.mark_lost(self.options.lease_s, self.options.campaign)
            self._lost += [lost.run_id for lost in swept]
            snapshot = take_snapshot(ledger, self.options.campaign, len(self.slots))
            self.display.show(snapshot)
        return snapshot

    def _work_left(self, ledger: Ledger) -> bool:
        snapshot = take_snapshot(ledger, self.options.campaign)
        resumable = sum(snapshot.counts.get(s, 0) for s in self.options.resume)
        return snapshot.counts.get("planned", 0) > 0 or resumable > 0

    def _on_signal(self, _signum: int, _frame: Any) -> None:
        self._stopping.set()
