"""Which examples each update of a run used: the data order made visible (``campaign order``).

The order is a function of the run's frozen config (seed, examples per update, last-batch
policy, sampling) and its task's training split alone, so it is recomputed, not stored:
update ``u`` of the run used exactly these example ids, whatever machine ran it and however
often it was resumed. Microbatch boundaries and data replicas are shown as the loop cuts
them (replica ``r`` takes microbatches ``r``, ``r + W``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from campaign.loop.task import build_task
from campaign.loop.task_order import make_order


def update_order(
    task_reference: str, config: Mapping[str, Any], first: int, last: int
) -> list[dict[str, Any]]:
    """One row per update ``first``..``last`` (1-based): update, epoch, the positions it read
    in that epoch's order (with replacement: no epoch, "drawn at random"), and its example
    ids microbatch by microbatch."""
    task = build_task(task_reference, dict(config))
    train = task.splits()["train"]
    loop = config["loop"]
    microbatch = int(loop["microbatch"])
    per_update = microbatch * int(loop["accumulation"]) * int(loop["replicas"])
    order = make_order(task, len(train), int(config.get("seed", 0)), per_update, loop)
    rows = []
    for update in range(1, last + 1):
        indices = order.next_update()
        if update < first:
            continue
        ids = [str(train[i]["id"]) for i in indices]
        drawn = order.sampling != "epochs"  # a draw per update: no epoch, no place
        rows.append({
            "update": update,
            "epoch": None if drawn else order.epoch,
            "positions": ("drawn by the task" if order.sampling == "task" else
                          "drawn at random") if drawn else
            f"{order.cursor - len(indices)}-{order.cursor - 1}",
            "microbatches": [ids[i : i + microbatch] for i in range(0, len(ids), microbatch)],
        })
    return rows
