"""Placement groups for the Ray executor's worker tasks, when a campaign's runs take several ranks.

Each worker task reserves W bundles (the campaign's largest ``loop.replicas``,
or ``--ranks``), one CPU and the rank's GPUs each, with Ray's placement
strategy (``--ray-placement``: ``PACK`` by default, as Ray Train's
``ScalingConfig``; ``STRICT_SPREAD`` puts every rank on a node of its own). The
worker runs in bundle 0 and a run's other ranks in the others
(:mod:`campaign.launch.ray_ranks`), so a run of W ranks never waits for
resources another worker holds, and Ray places its bundles again on another
node when one is lost. The groups are removed when the launch ends.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from campaign.launch.placement import PlacementError


class WorkerGroups:
    """The placement group of each worker task (none when runs take one rank)."""

    def __init__(self, ray: Any, ranks: int, gpus: float, strategy: str) -> None:
        self.ray, self.ranks, self.gpus, self.strategy = ray, ranks, gpus, strategy
        self.token = secrets.token_hex(4)  # a launch's own names on a shared cluster
        self.names: dict[int, str] = {}
        self.groups: dict[int, Any] = {}

    def task(self, function: Any, index: int, **options: Any) -> Any:
        """``function`` as the ``index``-th worker task, in bundle 0 of a group of its own."""
        remote = self.ray.remote(function)
        if self.ranks == 1:
            return remote.options(**options)
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = {"CPU": 1.0, **({"GPU": self.gpus} if self.gpus else {})}
        name = f"campaign:{self.token}:{index}"
        group = placement_group([dict(bundle) for _ in range(self.ranks)],
                                strategy=self.strategy, name=name)
        self.names[index], self.groups[index] = name, group
        strategy = PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=0, placement_group_capture_child_tasks=False)
        return remote.options(**options, scheduling_strategy=strategy)

    def arguments(self, index: int) -> tuple[Any, ...]:
        """What the worker task is told of its group: (name, bundles, GPUs per bundle)."""
        if self.ranks == 1:
            return ()
        return self.names[index], self.ranks, self.gpus

    def release(self, index: int) -> None:
        """Give back the ``index``-th worker's group once its task ended: on a shared cluster
        its W CPUs and GPUs go back to the others while the launch follows the rest."""
        group = self.groups.pop(index, None)
        if group is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):  # the cluster may be going away
                remove_placement_group(group)

    def remove(self) -> None:
        """Give back every group left (the launch ends, however it ends)."""
        for index in list(self.groups):
            self.release(index)


@contextmanager
def worker_groups(ray: Any, ranks: int, gpus: float, strategy: str) -> Iterator[WorkerGroups]:
    """The launch's worker groups, removed when it ends (nothing left reserved on a cluster)."""
    groups = WorkerGroups(ray, ranks, gpus, strategy)
    try:
        yield groups
    finally:
        groups.remove()


def refuse_shared_gpus(ranks: int, gpus: float) -> None:
    """Each rank of a run needs whole GPUs of its own: NCCL refuses two ranks on one device,
    and Ray would hand out a fraction of one to each."""
    if ranks > 1 and gpus and (gpus < 1 or gpus != int(gpus)):
        raise PlacementError(f"--gpus-per-run {gpus * ranks:g} over a run's {ranks} ranks gives "
                             f"{gpus:g} GPU per rank: each rank needs whole GPUs of its own "
                             f"(NCCL refuses two ranks on one device); use a multiple of "
                             f"{ranks}")


def refuse_unplaceable(ray: Any, ranks: int, gpus: float, strategy: str) -> None:
    """A group that no cluster of this shape can hold is one error line before anything is
    submitted (Ray itself would leave it pending until the schedule timeout)."""
    if ranks == 1:
        return
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    total = ray.cluster_resources()
    need = f"{ranks} bundles of 1 CPU" + (f" and {gpus:g} GPU" if gpus else "")
    if ranks > total.get("CPU", 0) or ranks * gpus > total.get("GPU", 0) + 1e-9:
        raise PlacementError(f"each worker's placement group needs {need} (its runs take "
                             f"{ranks} ranks) but the Ray cluster has {total.get('CPU', 0):g} "
                             f"CPU and {total.get('GPU', 0):g} GPU")
    if strategy == "STRICT_SPREAD" and ranks > len(nodes):
        raise PlacementError(f"--ray-placement STRICT_SPREAD puts each of a run's {ranks} ranks "
                             f"on a node of its own, but the Ray cluster has {len(nodes)} "
                             "node(s)")
    if strategy == "STRICT_PACK" and not any(
            node["Resources"].get("CPU", 0) >= ranks
            and node["Resources"].get("GPU", 0) + 1e-9 >= ranks * gpus for node in nodes):
        raise PlacementError(f"--ray-placement STRICT_PACK puts a run's {ranks} ranks on one "
                             f"node, but no node of the Ray cluster has {need}")
