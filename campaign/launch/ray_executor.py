"""The Ray executor: one Ray task per run, each with its GPU resource, on a shared ledger.

Ray only places work; the ledger stays the queue and the judge. Each task
opens the ledger itself and executes its run through
:func:`campaign.launch.worker.run_one`, so a task Ray retries after its
process died finds the run held by a dead lease, waits for it to be
declared lost, and continues it from its checkpoint instead of starting a
second execution.

A Ray instance that the launcher starts itself binds to the loopback
interface only (Ray's single-node mode) and has token authentication on
(``RAY_AUTH_MODE=token`` with a fresh random token), so nothing else on the
network can submit work to it. A request that can never be scheduled (GPUs
on a cluster without them) is refused before submission; anything else that
stays unscheduled ends after ``schedule_timeout_s`` with a clear error
instead of hanging.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from dataclasses import dataclass
from typing import Any

from campaign.launch.live_table import ProgressDisplay, Snapshot, take_snapshot
from campaign.launch.placement import (
    PlacementError,
    options_document,
    outcome_document,
    run_placed,
)
from campaign.launch.worker import WorkerOptions
from campaign.ledger import Ledger

MAX_TASK_RETRIES = 3


@dataclass(frozen=True)
class RayOptions:
    address: str | None = None
    workers: int | None = None  # CPUs of a private local instance (default: all)
    devices: str = "cpu"
    gpus_per_run: float | None = None
    schedule_timeout_s: float = 600.0
    max_retries: int = MAX_TASK_RETRIES

    @property
    def gpus(self) -> float:
        if self.gpus_per_run is not None:
            return self.gpus_per_run
        return 1.0 if self.devices.startswith("cuda") else 0.0


def execute_run_task(url: str, options: dict[str, Any], run_id: str, cwd: str) -> dict[str, Any]:
    """The body of one Ray task (module level, so Ray ships it by reference)."""
    return outcome_document(run_id, run_placed(url, options, run_id, cwd))


def launch_on_ray(
    url: str, options: WorkerOptions, ray_options: RayOptions, display: ProgressDisplay
) -> tuple[Snapshot, bool]:
    """Submit one task per run of the campaign and follow them to the end; (the last
    snapshot, interrupted)."""
    started_here = ray_options.address is None
    if started_here:  # read by Ray at import: set before it
        os.environ.setdefault("RAY_AUTH_MODE", "token")
        if os.environ["RAY_AUTH_MODE"] == "token":
            os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    ray = _import_ray(loopback=started_here)
    if started_here:
        ray.init(num_cpus=ray_options.workers or os.cpu_count(), include_dashboard=False,
                 log_to_driver=False, logging_level="ERROR")  # fmt: skip
    else:
        ray.init(address=ray_options.address, log_to_driver=False, logging_level="ERROR")
    try:
        return _follow(ray, url, options, ray_options, display), False
    finally:
        ray.shutdown()


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


def _follow(
    ray: Any, url: str, options: WorkerOptions, ray_options: RayOptions, display: ProgressDisplay
) -> Snapshot:
    gpus = ray_options.gpus
    available = ray.cluster_resources().get("GPU", 0)
    if gpus > available:
        raise PlacementError(
            f"each run asks for {gpus:g} GPU(s) but the Ray cluster has {available:g}: "
            "no run could ever be scheduled (use --devices cpu or --gpus-per-run 0)"
        )
    with Ledger.open(url) as ledger:
        statuses = ["planned", *options.resume]
        run_ids = [str(r) for r in ledger.runs(options.campaign, status=statuses)["run_id"]]
        task = ray.remote(execute_run_task).options(
            num_cpus=1, num_gpus=gpus, max_retries=ray_options.max_retries,
            retry_exceptions=False, name=f"campaign:{options.campaign}",
        )  # fmt: skip
        payload = options_document(options, threads=1)
        refs = [task.remote(url, payload, run_id, os.getcwd()) for run_id in run_ids]
        began = time.monotonic()
        pending, failures = list(refs), []
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
            for ref in done:
                try:
                    ray.get(ref)
                except Exception as error:  # past its retries: the ledger shows the run's state
                    lines = str(error).strip().splitlines()
                    failures.append(lines[-1] if lines else type(error).__name__)
            ledger.mark_lost(options.lease_s, options.campaign)
            snapshot = take_snapshot(ledger, options.campaign)
            display.show(snapshot)
            if _nothing_started(snapshot, run_ids, ledger) and (
                time.monotonic() - began > ray_options.schedule_timeout_s
            ):
                for ref in pending:
                    ray.cancel(ref, force=True)
                raise PlacementError(
                    f"no run could start on the Ray cluster within "
                    f"{ray_options.schedule_timeout_s:g} s (resources: "
                    f"{ray.cluster_resources()}; each run asks for 1 CPU and {gpus:g} GPU)"
                )
        snapshot = take_snapshot(ledger, options.campaign)
        display.show(snapshot)
        display.close()
    for failure in failures:
        print(f"campaign: a Ray task failed past its retries: {failure}", file=sys.stderr)
    return snapshot


def _nothing_started(snapshot: Snapshot, run_ids: list[str], ledger: Ledger) -> bool:
    runs = ledger.runs(snapshot.campaign)
    mine = runs[runs["run_id"].isin(run_ids)]
    return bool(mine["started_at"].isna().all())
