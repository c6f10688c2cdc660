"""Data replicas: one run trained by several processes, each on its share of every update.

torchrun-style process groups (``MASTER_ADDR``/``MASTER_PORT``, rank, world
size): gloo on CPU, NCCL on CUDA. Every rank builds the same model from the
same seed and sees the same data order; each update's microbatches are dealt
out round-robin (rank r takes microbatches r, r+W, ...). Exactness as in one
process: every rank backpropagates loss *sums*, the gradients, loss sums and
unit counts are summed across ranks, and the gradients are divided by the
units of the whole effective batch. The result equals the single-process
gradient of the same effective batch (up to summation order).

Only rank 0 writes to the ledger and to the artifacts folder; the others
read what they need (the checkpoint to resume from) from rank 0 through the
process group as JSON bytes: nothing is pickled.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from campaign.errors import LoopError
from campaign.loop import progress_page
from campaign.loop.task import Batch, TaskContract

_T = TypeVar("_T")


@dataclass(frozen=True)
class Replica:
    """This process's place in a run's process group."""

    rank: int
    world: int

    @property
    def leader(self) -> bool:
        return self.rank == 0


def device_for(device: str, rank: int) -> str:
    """Rank r uses the r-th device after the leader's (CUDA); every rank shares the CPU."""
    parsed = torch.device(device)
    if parsed.type != "cuda":
        return device
    return f"cuda:{(parsed.index or 0) + rank}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


ARRIVED = "campaign/arrived"  # the rendezvous store's count of ranks > 0 that reached it


@contextlib.contextmanager
def process_group(
    replica: Replica, address: str, port: int, device: torch.device, timeout_s: float = 300,
    while_waiting: Callable[[], None] | None = None,
) -> Iterator[Replica]:
    """Join the run's process group (gloo on CPU, NCCL on CUDA); leave it afterwards.

    Rank 0 serves the rendezvous store and waits until every other rank has reached it,
    calling ``while_waiting`` between looks: whoever started the other ranks raises there
    when one of them ended first (rank 0 then does not wait out the group's timeout), and
    decides how long it waits (with it, there is no deadline here)."""
    from datetime import timedelta

    backend = "nccl" if device.type == "cuda" else "gloo"
    store = dist.TCPStore(address, port, world_size=replica.world, is_master=replica.leader,
                          timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
    if replica.leader:
        deadline = time.monotonic() + timeout_s
        while store.add(ARRIVED, 0) < replica.world - 1:
            if while_waiting is not None:
                while_waiting()
            elif time.monotonic() > deadline:
                raise TimeoutError(f"{replica.world - 1 - store.add(ARRIVED, 0)} of the run's "
                                   f"other ranks did not reach {address}:{port} within "
                                   f"{timeout_s:g} s")
            time.sleep(0.1)
    else:
        store.add(ARRIVED, 1)
    dist.init_process_group(backend, store=store, rank=replica.rank, world_size=replica.world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        yield replica
    finally:
        dist.destroy_process_group()


def share(items: Sequence[_T], replica: Replica) -> list[_T]:
    """This rank's microbatches of an update: round-robin over ranks."""
    return list(items[replica.rank :: replica.world])


def accumulate_across(
    task: TaskContract,
    model: torch.nn.Module,
    batches: Sequence[Batch],
    replica: Replica,
    autocast: contextlib.AbstractContextManager[Any] | None = None,
) -> tuple[float, int]:
    """Backpropagate this rank's loss sums; sum gradients, loss and units over all ranks; divide
    by the units of the whole effective batch. Returns the global (loss sum, units)."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    device = parameters[0].device if parameters else torch.device("cpu")
    total = torch.zeros(2, dtype=torch.float64, device=device)
    for batch in batches:
        progress_page.tick("forward")  # a supervisor names the phase a hang is in
        with autocast if autocast is not None else contextlib.nullcontext():
            loss_sum, count = task.loss(model, batch)
        progress_page.tick("backward")
        loss_sum.backward()
        total[0] += loss_sum.detach().to(torch.float64)
        total[1] += int(count)
    for parameter in parameters:  # a rank with no microbatch still joins every reduction
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
    grads = [p.grad for p in parameters]
    flat = torch.cat([g.reshape(-1) for g in grads]) if grads else torch.zeros(0, device=device)
    dist.all_reduce(flat)
    dist.all_reduce(total)
    units = int(total[1].item())
    if units == 0:
        raise LoopError("an effective batch with no loss units (every target masked out)")
    offset = 0
    for grad in grads:
        size = grad.numel()
        grad.copy_(flat[offset : offset + size].view_as(grad)).div_(units)
        offset += size
    return float(total[0].item()), units


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when ``flag`` is true on any: a stop decided by one is taken by all."""
    return any_ranks([flag], device)[0]


def any_ranks(flags: Sequence[bool], device: torch.device) -> list[bool]:
    """Each flag, true on every rank when it is true on any (one small all-reduce)."""
    value = torch.tensor([1.0 if f else 0.0 for f in flags], dtype=torch.float64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return [bool(v > 0) for v in value.tolist()]


def broadcast_json(document: Any, replica: Replica, device: torch.device) -> Any:
    """Send a JSON-able document from rank 0 to every rank (as UTF-8 bytes, no pickle)."""
    payload = json.dumps(document).encode() if replica.leader else b""
    size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    buffer = torch.zeros(int(size.item()), dtype=torch.uint8, device=device)
    if replica.leader:
        buffer.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
    dist.broadcast(buffer, src=0)
    return json.loads(bytes(buffer.cpu().tolist()).decode())


def gather_json(document: Any, replica: Replica, device: torch.device) -> list[Any] | None:
    """Every rank's JSON-able document, in rank order, on rank 0 (None elsewhere); UTF-8
    bytes in padded tensors, no pickle (``all_gather_object`` would unpickle)."""
    payload = json.dumps(document).encode()
    size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(replica.world)]
    dist.all_gather(sizes, size)
    longest = max(int(s.item()) for s in sizes)
    buffer = torch.zeros(longest, dtype=torch.uint8, device=device)
    if payload:
        buffer[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    buffers = [torch.zeros_like(buffer) for _ in range(replica.world)]
    dist.all_gather(buffers, buffer)
    if not replica.leader:
        return None
    return [json.loads(bytes(b[: int(n.item())].cpu().tolist()).decode())
            for b, n in zip(buffers, sizes, strict=True)]


def environment_for(replica: Replica, address: str, port: int) -> dict[str, str]:
    """torchrun's variables, for tools that read them (and for humans reading `ps e`)."""
    return {
        "RANK": str(replica.rank), "WORLD_SIZE": str(replica.world),
        "LOCAL_RANK": str(replica.rank), "MASTER_ADDR": address, "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }


class DiscardedMetrics:
    """The metric writer of a non-zero replica: rank 0 logs the run's (global) values."""

    def log(self, *args: Any, **kwargs: Any) -> None:
        return None

    log_dict = log

    def flush(self) -> int:
        return 0

    def close(self) -> None:
        return None

    def pending_rows(self) -> list[list[Any]]:
        return []


def rows_of_every_rank(rows: list[dict[str, Any]], replica: Replica,
                       device: torch.device) -> list[dict[str, Any]]:
    """Phase rows of every rank on rank 0 (empty elsewhere), their device labelled by rank:
    each rank's memory is its own (the ranks measure the same steps, so all have rows)."""
    gathered = gather_json(rows, replica, device)
    return [{**row, "device": f"{row['device']} (rank {rank})"}
            for rank, mine in enumerate(gathered or []) for row in mine]
