"""Per-device memory of a gate class under each distribution strategy, and the rental that fits.

The articles' rental sheet names the distribution strategy beside memory per GPU, precision,
microbatch and accumulation. From what the pilot measured of the class (its model's state
in bytes, counted from the tensors themselves: parameters, gradients, the optimizer's state
after its first step; its shard units; one microbatch's saved activations), per device and
for W ranks:

- ``replicate``: every rank holds the whole state: weights + gradients + optimizer state
  + activations;
- ``fsdp`` (FSDP2): each rank holds 1/W of the weights, gradients and optimizer state
  (``torch.chunk``'s split of every tensor's first dimension, so the share is computed tensor
  by tensor), plus the units gathered whole while they compute: two units at a time (the one
  running and the one prefetched), in the parameters' own dtype (bf16 is autocast, as in one
  process), and one unit's unsharded gradient before its reduce-scatter; the activations are
  the same.

Examples per update count the data-parallel ranks for both strategies (each rank takes its
own microbatches), so a class's effective batch is ``microbatch x accumulation x W``. The time
per update is a rank's share of the pilot's one-process update (compute split evenly, the
collectives not counted; a pilot of the class at its W measures them: its ``replicas`` rows).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

STRATEGY_NAMES = ("replicate", "fsdp")
RANKS = (1, 2, 4, 8)
CARDS_GIB = (16, 24, 40, 48, 80, 96, 141, 192)  # memory per device of the usual rentals
ASSUMPTIONS = (
    "per device: state counted from the piloted tensors (fsdp: each tensor's torch.chunk share "
    "of its first dimension, plus two units gathered in the parameters' dtype and one unit's "
    "unsharded gradient), one microbatch's saved activations as measured; the CUDA context, "
    "allocator caches and communication buffers are not included; the time per update is a "
    "rank's share of the pilot's one-process update (collectives not counted)"
)


def state_facts(model: Any, task: Any, optimizer: Any, loop: Mapping[str, Any]) -> dict[str, Any]:
    """What the strategy sheet needs of a built model (after the optimizer's first step): the
    bytes of its parameters, gradients and optimizer state, each tensor's first-dimension
    size (for the shares), and its shard units (count, the largest's bytes)."""
    from campaign.loop.sharding import find_units

    def rows(tensor: Any) -> int:
        return int(tensor.shape[0]) if tensor.dim() else 1

    parameters = list(model.parameters())
    tensors = [[rows(p), p.numel() * p.element_size()] for p in parameters]
    gradients = [[rows(p), p.numel() * p.element_size()] for p in parameters if p.requires_grad]
    optimizer_state = [[rows(v), v.numel() * v.element_size()]
                       for state in optimizer.state.values() for v in state.values()
                       if hasattr(v, "numel") and v.dim() >= 1]
    try:
        units, how = find_units(model, task, loop.get("shard_modules"))
    except Exception as error:  # a wrong loop.shard_modules: plan refuses it; say it here too
        units, how = [], f"no units: {error}"
    unit_bytes = [sum(p.numel() * p.element_size() for p in u.parameters()) for u in units]
    unit_values = [sum(p.numel() for p in u.parameters()) for u in units]
    whole = sum(p.numel() for p in parameters)
    return {"parameters": tensors, "gradients": gradients, "optimizer": optimizer_state,
            "units": len(units), "units_found": how,
            "largest_unit_values": max(unit_values, default=whole),
            "largest_unit_bytes": max(unit_bytes, default=sum(t[1] for t in tensors)),
            "largest_unit_trainable_bytes": max(
                (sum(p.numel() * p.element_size() for p in u.parameters() if p.requires_grad)
                 for u in units), default=sum(g[1] for g in gradients))}


def share(tensors: Sequence[Sequence[int]], world: int, rank: int = 0) -> int:
    """Bytes rank ``rank`` of ``world`` holds of ``tensors`` ([rows, bytes] each), sharded by
    ``torch.chunk`` of the first dimension (rank 0 holds the most)."""
    held = 0
    for rows, size in tensors:
        per_row = size / max(1, rows)
        chunk = math.ceil(rows / world)
        held += round(per_row * max(0, min(chunk, rows - rank * chunk)))
    return held


def total(tensors: Sequence[Sequence[int]]) -> int:
    return sum(int(size) for _, size in tensors)


def per_device(facts: Mapping[str, Any], activations: int, strategy: str, world: int,
               precision: str) -> dict[str, int]:
    """Bytes per device of each part, and their sum, for ``strategy`` on ``world`` ranks."""
    if strategy == "replicate" or world == 1:
        parts = {"weights_bytes": total(facts["parameters"]),
                 "gradient_bytes": total(facts["gradients"]),
                 "optimizer_bytes": total(facts["optimizer"]), "gathered_bytes": 0}
    else:
        unit = int(facts["largest_unit_bytes"])  # gathered in the parameters' own dtype
        parts = {"weights_bytes": share(facts["parameters"], world),
                 "gradient_bytes": share(facts["gradients"], world),
                 "optimizer_bytes": share(facts["optimizer"], world),
                 "gathered_bytes": min(2, max(1, int(facts["units"]))) * unit
                 + int(facts["largest_unit_trainable_bytes"])}
    parts["activation_bytes"] = int(activations)
    parts["per_device_bytes"] = sum(parts.values())
    return parts


def smallest_card(needed: int, headroom: float, cards: Sequence[int]) -> int | None:
    """The smallest card (bytes) that holds ``needed`` with ``headroom`` left free."""
    return next((c for c in sorted(cards) if needed <= c * (1 - headroom)), None)


def strategy_rows(facts: Mapping[str, Any], activations: int, loop: Mapping[str, Any],
                  update_s: float | None, headroom: float,
                  card: int | None = None) -> list[dict[str, Any]]:
    """One row per (strategy, W): the parts per device, the smallest rental that fits them
    with ``headroom`` (``card``: only that card), examples and time per update (each rank
    takes the class's microbatches; ``update_s``: the pilot's one process, which took the
    class's W ranks' microbatches, so a rank's share of it is the time per update)."""
    per_rank_s = None if update_s is None else update_s / max(1, int(loop["replicas"]))
    cards = [card] if card is not None else [c * 2**30 for c in CARDS_GIB]
    microbatches = int(loop["microbatch"]) * int(loop["accumulation"])
    rows = []
    for strategy in STRATEGY_NAMES:
        for world in RANKS:
            parts = per_device(facts, activations, strategy, world, str(loop["precision"]))
            fits = smallest_card(parts["per_device_bytes"], headroom, cards)
            rows.append({
                "strategy": strategy, "ranks": world, **parts,
                "fits": fits is not None,
                "rental": f"{world} x {fits / 2**30:g} GiB" if fits else None,
                "examples_per_update": microbatches * world,
                "update_s": None if per_rank_s is None else round(per_rank_s, 6),
            })
    return rows


def smallest_rentals(rows: Sequence[Mapping[str, Any]]) -> dict[str, str | None]:
    """Per strategy, the rental with the least memory in all (devices x memory) that fits."""
    found: dict[str, str | None] = {}
    for strategy in STRATEGY_NAMES:
        fitting = [r for r in rows if r["strategy"] == strategy and r["fits"]]
        best = min(fitting, key=lambda r: (r["ranks"] * float(r["rental"].split(" x ")[1][:-4]),
                                           r["ranks"]), default=None)
        found[strategy] = best["rental"] if best else None
    return found


def strategy_table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows as a person reads them: sizes in MiB, the rental, the time per update."""
    def mib(value: Any) -> float:
        return round(int(value) / 2**20, 2)

    return [{"gate_class": r["gate_class"], "strategy": r["strategy"], "ranks": r["ranks"],
             "weights_mib": mib(r["weights_bytes"]), "gradients_mib": mib(r["gradient_bytes"]),
             "optimizer_mib": mib(r["optimizer_bytes"]), "gathered_mib": mib(r["gathered_bytes"]),
             "activations_mib": mib(r["activation_bytes"]),
             "per_device_mib": mib(r["per_device_bytes"]), "rental": r["rental"] or "none fits",
             "examples_per_update": r["examples_per_update"], "update_s": r["update_s"]}
            for r in rows]
