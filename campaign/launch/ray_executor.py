"""The Ray executor: Ray tasks that are workers, on a shared ledger.

Ray only places workers; the ledger stays the queue and the judge. Each task
is a worker (:func:`campaign.launch.worker.run_worker`) with one task host:
it claims runs until none is left, so the gap between two runs on one slot
is a local worker's. A task Ray retries after its process died is a new
worker; the run the dead one held is declared ``lost`` once its lease
expires and continued (``--resume-lost``) by whichever worker is free.

What Ray is handed carries the ledger URL without its password (Ray keeps a
task's arguments in its control store and shows the driver's command line in
its jobs API): the password travels in a 0600 file
(:mod:`campaign.launch.secret_file`), and the driver's ``sys.argv`` is shown
with the password masked.

A Ray instance that the launcher starts itself binds to the loopback
interface only (Ray's single-node mode) and has token authentication on
(``RAY_AUTH_MODE=token`` with a fresh random token). ``--address`` or
``RAY_ADDRESS`` joins an existing cluster instead. A request that can never
be scheduled (GPUs on a cluster without them) is refused before submission;
anything else that stays unscheduled ends after ``schedule_timeout_s``.

SIGINT/SIGTERM to the launcher: every worker task is cancelled gently (Ray
raises KeyboardInterrupt in it: its run checkpoints and ends
``interrupted``); after the grace, the rest are killed.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from campaign.launch.live_table import ProgressDisplay
from campaign.launch.placement import (
    PlacementError,
    enter,
    options_document,
    options_from,
    settle,
)
from campaign.launch.ray_groups import refuse_shared_gpus, refuse_unplaceable, worker_groups
from campaign.launch.ray_ranks import GROUP_ENV, last_line, placed_at
from campaign.launch.search_work import is_search
from campaign.launch.secret_file import handed_over, taken_back
from campaign.launch.worker import WorkerOptions, run_worker
from campaign.ledger import Ledger
from campaign.ledger.connections import safe_url
from campaign.ledger.progress import Snapshot, take_snapshot

MAX_TASK_RETRIES = 3
ADDRESS_ENV = "RAY_ADDRESS"


@dataclass(frozen=True)
class RayOptions:
    address: str | None = None
    workers: int | None = None  # worker tasks (default: the cluster's CPUs)
    devices: str = "cpu"
    gpus_per_run: float | None = None
    schedule_timeout_s: float = 600.0
    max_retries: int = MAX_TASK_RETRIES
    grace_s: float = 300.0
    ranks: int = 1  # the most ranks a run takes: each worker task's placement group's bundles
    placement: str = "PACK"  # Ray's placement group strategy (as Ray Train's ScalingConfig)

    @property
    def gpus(self) -> float:
        """GPUs each rank asks for (a run's ``--gpus-per-run`` over its ranks)."""
        if self.gpus_per_run is not None:
            return self.gpus_per_run / self.ranks
        return 1.0 if self.devices.startswith("cuda") else 0.0


def cluster_address(address: str | None) -> str | None:
    """``--address``, else ``RAY_ADDRESS`` (as Ray's own tools read it), else None: a private
    instance."""
    return address or os.environ.get(ADDRESS_ENV) or None


def execute_worker_task(url: str, secret: str | None, document: dict[str, Any],
                        cwd: str, group: str | None = None, bundles: int = 1,
                        gpus: float = 0.0) -> dict[str, Any]:
    """The body of one Ray task: a worker (module level, so Ray ships it by reference). In
    bundle 0 of placement ``group`` (runs of several ranks), its runs' processes learn the
    group from the environment and place ranks 1..W-1 in the other bundles."""
    enter(cwd)
    before = os.environ.get(GROUP_ENV)
    if group is not None:  # this task's runs only: Ray reuses its worker processes
        import ray

        context = ray.get_runtime_context()
        os.environ[GROUP_ENV] = placed_at(context.gcs_address, context.namespace, group,
                                          bundles, gpus, ray.util.get_node_ip_address(), url,
                                          secret, cwd)
    try:
        with Ledger.open(taken_back(url, secret), ride_out=True) as ledger:
            report = run_worker(ledger, options_from(document))
    finally:
        if before is None:
            os.environ.pop(GROUP_ENV, None)
        else:
            os.environ[GROUP_ENV] = before
    return {"worker": report.worker, "runs": [asdict(o) for o in report.outcomes],
            "stopped": report.stopped_by_signal}


def launch_on_ray(
    url: str, options: WorkerOptions, ray_options: RayOptions, display: ProgressDisplay
) -> tuple[Snapshot, bool]:
    """Start the worker tasks and follow the campaign to the end; (the last snapshot,
    interrupted)."""
    refuse_shared_gpus(ray_options.ranks, ray_options.gpus)  # before any cluster is asked
    address = cluster_address(ray_options.address)
    if address is None:  # read by Ray at import: set before it
        os.environ.setdefault("RAY_AUTH_MODE", "token")
        if os.environ["RAY_AUTH_MODE"] == "token":
            os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    signals: list[int] = []  # SIGHUP too: a closed terminal must not leave runs running
    stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def on_stop(signum: int, _frame: Any) -> None:
        signals.append(signum)

    previous = {s: signal.signal(s, on_stop) for s in stops}
    try:
        _mask_command_line()
        with _quiet_stdout(), handed_over(url) as (engine_url, secret):
            ray = _import_ray(loopback=address is None)
            _connect(ray, address, ray_options)
            for signum in stops:  # ray.init installs its own (SIGTERM: exit with a stack dump)
                signal.signal(signum, on_stop)
            try:
                snapshot = _follow(ray, url, (engine_url, secret), options, ray_options,
                                   display, signals)
            finally:
                ray.shutdown()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return snapshot, bool(signals)


def _reachable(address: str) -> None:
    """A cluster address that nothing answers at is one error line at once (Ray itself retries
    for minutes, printing C++ warnings)."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():  # "auto", or a form Ray resolves itself
        return
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as error:
        raise PlacementError(f"no Ray cluster answers at {address}: {error}") from None


def _connect(ray: Any, address: str | None, ray_options: RayOptions) -> None:
    if address is not None:
        _reachable(address)
    try:
        if address is None:
            # Logical CPUs: one per rank of each worker asked for (else the machine's), and at
            # least one run's ranks (a placement group of W bundles).
            cpus = (ray_options.workers * ray_options.ranks if ray_options.workers
                    else os.cpu_count() or 1)
            # Ray raises its workers' niceness by 15, below everything else on the machine;
            # the runs of a private instance are this launch's own work and run at its
            # niceness, as the local executor's do (an increment of 0; a value the user set
            # is kept).
            os.environ.setdefault("RAY_worker_niceness", "0")
            ray.init(num_cpus=max(cpus, ray_options.ranks), include_dashboard=False,
                     log_to_driver=False, logging_level="ERROR")
        else:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError) as error:
        where = f"the Ray cluster at {address}" if address else "a private Ray instance"
        lines = str(error).strip().splitlines()
        raise PlacementError(f"cannot connect to {where}: {lines[0] if lines else error}"
                             ) from None


@contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Ray's own messages ("A worker died...", state dumps) go to stderr while it runs, so
    that stdout carries only the command's output (one JSON document with --format json)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _mask_command_line() -> None:
    """Ray records the driver's command line as read from /proc (its jobs API shows it): a
    ledger URL on it is shown without its password, there and in ``ps``, from here on
    (setproctitle rewrites the process's argv)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    def masked(word: str) -> str:
        if "://" not in word:
            return word
        try:
            return safe_url(make_url(word))
        except ArgumentError:
            return word

    shown = [masked(word) for word in sys.argv]
    if shown == sys.argv:
        return
    try:
        import setproctitle
    except ImportError:  # part of the ray extra; without it the URL stays visible
        return
    setproctitle.setproctitle(subprocess.list2cmdline([sys.executable, *shown]))


def _import_ray(*, loopback: bool) -> Any:
    if loopback:
        # Ray's single-node mode: every server of the instance binds 127.0.0.1 (read by
        # ray at import; the variable's name is historical).
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    try:
        import ray
    except ImportError:
        raise PlacementError("--executor ray needs Ray: pip install 'campaign[ray]'") from None
    return ray


def _follow(ray: Any, url: str, handed: tuple[str, str | None], options: WorkerOptions,
            ray_options: RayOptions, display: ProgressDisplay,
            signals: list[int]) -> Snapshot:
    gpus = ray_options.gpus
    resources = ray.cluster_resources()
    if gpus > resources.get("GPU", 0):
        raise PlacementError(
            f"each run asks for {gpus:g} GPU(s) but the Ray cluster has "
            f"{resources.get('GPU', 0):g}: no run could ever be scheduled "
            "(use --devices cpu or --gpus-per-run 0)"
        )
    ranks = ray_options.ranks
    refuse_unplaceable(ray, ranks, gpus, ray_options.placement)
    with (Ledger.open(url, ride_out=True) as ledger,  # the launcher follows through an outage
          worker_groups(ray, ranks, gpus, ray_options.placement) as groups):
        ledger.mark_lost(options.lease_s, options.campaign)  # swept before anything is listed
        waiting = len(ledger.runs(options.campaign, status=["planned", *options.resume]))
        slots = max(1, int(resources.get("CPU", 1)) // ranks)  # a group of W CPUs each
        if is_search(ledger, options.campaign):  # its proposals are planned as it goes
            waiting = max(waiting, ray_options.workers or slots)
        count = max(1, min(ray_options.workers or slots, waiting))
        # Ray sets CUDA_VISIBLE_DEVICES to the task's GPUs: "cuda" is the first of them.
        payload = options_document(options, threads=1, device="cuda" if gpus else "cpu")
        refs = [groups.task(execute_worker_task, index, num_cpus=1, num_gpus=gpus,
                            max_retries=ray_options.max_retries, retry_exceptions=False,
                            name=f"campaign:{options.campaign}"
                            ).remote(*handed, payload, os.getcwd(), *groups.arguments(index))
                for index in range(count)]
        began, cancelled_at = time.monotonic(), None
        ended_before, started = take_snapshot(ledger, options.campaign).done, False
        pending, failures = list(refs), []
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
            failures += _failures(ray, done)
            for ref in done:  # its placement group goes back to the cluster
                groups.release(refs.index(ref))
            ledger.mark_lost(options.lease_s, options.campaign)
            snapshot = take_snapshot(ledger, options.campaign, count)
            display.show(snapshot)
            started = started or bool(snapshot.running) or snapshot.done > ended_before
            if signals:
                if cancelled_at is None:  # KeyboardInterrupt in each task: runs checkpoint
                    cancelled_at = time.monotonic()
                    for ref in pending:
                        ray.cancel(ref, force=False)
                elif len(signals) > 1 or time.monotonic() - cancelled_at > ray_options.grace_s:
                    for ref in pending:
                        ray.cancel(ref, force=True)
            elif not started and time.monotonic() - began > ray_options.schedule_timeout_s:
                for ref in pending:
                    ray.cancel(ref, force=True)
                raise PlacementError(
                    f"no run could start on the Ray cluster within "
                    f"{ray_options.schedule_timeout_s:g} s (resources: "
                    f"{ray.cluster_resources()}; each worker asks for {ray_options.ranks} CPU and "
                    f"{gpus * ray_options.ranks:g} GPU)"
                )
        snapshot = settle(ledger, options, display)
        display.show(snapshot)
        display.close()
    for failure in dict.fromkeys(failures):
        if not signals:
            print(f"campaign: a Ray worker task failed past its retries: {failure}",
                  file=sys.stderr)
    return snapshot


def _failures(ray: Any, done: list[Any]) -> list[str]:
    failures = []
    for ref in done:
        try:
            ray.get(ref)
        except Exception as error:  # past its retries (or cancelled): the ledger says the rest
            failures.append(last_line(error))
    return failures
