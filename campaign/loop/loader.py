"""Each update's batches prepared by torch ``DataLoader`` workers, in the run's own data order.

The run's :class:`~campaign.loop.data.DataOrder` stays the one source of the
order: the loader's batch sampler walks a copy of it from the position the run
is at (a resume starts a new loader from the checkpoint's position), one item
per update (this replica's microbatches), so the examples of every update and
their order are the same whatever ``loop.loader_workers`` is.

**Per-example randomness** (a random crop, a random mask) is made exact the
same way: before ``dataset[index]`` runs, Python's, NumPy's and torch's CPU
generators are seeded from (run seed, epoch, position in the epoch), never from
a worker's identity; ``collate`` is seeded the same way from its microbatch's
first example. In the training process (no workers) the generators' states are
saved before the update's reads and restored after its collates, so the
training RNG is left exactly as it was. A task whose reads and collates draw
nothing says so (``random_examples = False``, as the built-in tasks do) and
pays none of it: seeding three generators costs about 15 us a read, 25 times
the digits task's whole collate (benchmarks/example_seeding.py). The pilot's
data phase holds it to its word: examples read and collated under two other
seeds must be identical. Collating runs in the
worker; the training process only moves tensors to the device (pinned memory
and non-blocking copies on CUDA with ``loop.pin_memory``).

``loop.prefetch`` updates per worker are prepared ahead while the current one
computes. A worker's error names the example (index, and id when the example
was read) and ends the run ``failed`` with its traceback; a worker that dies
is detected by torch's own watchdog (the run fails, it does not hang). The
time the training process waits for each update's batches is returned with
them (``train/data_wait_s``).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from campaign.errors import LoopError, OrderEnded
from campaign.loop import replicas as dp
from campaign.loop.data import DataOrder
from campaign.loop.task import Batch, TaskContract

Key = tuple[int, int, int, int]  # (index in the split, epoch, position in the epoch, microbatch)
COLLATE_SALT = 0x5EED_C011A7E  # a collate's seed differs from its first example's


def example_seed(seed: int, epoch: int, position: int) -> int:
    """The seed of one example's randomness: a function of the run and the example's place
    in the data order only (2**63 - 25 is prime: the three numbers mix without overlap)."""
    return ((seed * 1_000_003 + epoch) * 2_147_483_659 + position) % (2**63 - 25)


def seed_generators(value: int) -> None:
    """Seed Python's, NumPy's and torch's CPU generators for one example or one collate."""
    random.seed(value)
    np.random.seed([value & 0xFFFFFFFF, value >> 32])  # all 63 bits
    torch.default_generator.manual_seed(value)


class PreservedGenerators:
    """The three generators' states saved before a block and restored after it: once per
    update around every read and collate of the update in the training process (with no
    workers), so the training RNG is left exactly as it was. Saving and restoring is most of
    the cost (NumPy's state alone about 60 us a round trip): once an update instead of once
    an example (benchmarks/example_seeding.py); each example is seeded on its own as before,
    so every draw is the same, bit for bit."""

    def __enter__(self) -> None:
        self.saved = random.getstate(), np.random.get_state(), torch.get_rng_state()

    def __exit__(self, *_: object) -> None:
        random.setstate(self.saved[0])
        np.random.set_state(self.saved[1])
        torch.set_rng_state(self.saved[2])


def draws_randomness(task: TaskContract) -> bool:
    """Whether the task's reads and collates may draw from the global generators (the
    default: only a task that declares ``random_examples = False`` is read unseeded)."""
    return getattr(task, "random_examples", True) is not False


class SeededExamples(Dataset[Any]):
    """``dataset[index]`` with every global generator seeded by the example's place (when the
    task draws: ``seeded``)."""

    def __init__(self, dataset: Any, seed: int, seeded: bool = True) -> None:
        self.dataset, self.seed, self.seeded = dataset, seed, seeded

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Key) -> tuple[Key, Any]:
        index, epoch, position, _ = key
        try:
            if self.seeded:
                seed_generators(example_seed(self.seed, epoch, position))
            return key, self.dataset[index]
        except Exception as error:
            raise LoopError(f"reading training example at index {index} (epoch {epoch}, "
                            f"position {position}) failed: {type(error).__name__}: {error}"
                            ) from error


class UpdateSampler(Sampler[list[Key]]):
    """One item per update: this replica's keys, microbatch by microbatch, for ever (the run
    stops taking updates when its budget or a stop rule says so)."""

    def __init__(self, order: DataOrder, microbatch: int, replica: dp.Replica) -> None:
        self.order, self.microbatch, self.replica = order, microbatch, replica

    def __iter__(self) -> Iterator[list[Key]]:
        while True:
            try:
                indices = self.order.next_update()
            except OrderEnded:  # drawn ahead past a task's order: the run stops before
                return

            epoch, first = self.order.epoch, self.order.cursor - len(indices)
            keys = [(index, epoch, first + offset) for offset, index in enumerate(indices)]
            chunks = [keys[i : i + self.microbatch] for i in range(0, len(keys), self.microbatch)]
            if self.replica.world > 1:
                chunks = dp.share(chunks, self.replica)
            yield [(*key, number) for number, chunk in enumerate(chunks) for key in chunk]


class CollateUpdate:
    """The worker's side: examples of one update -> its collated microbatches (CPU)."""

    def __init__(self, task: TaskContract, seed: int, seeded: bool = True) -> None:
        self.task, self.seed, self.seeded = task, seed, seeded

    def __call__(self, items: Sequence[tuple[Key, Any]]) -> list[Batch]:
        batches = []  # the sampler gives the update's keys microbatch by microbatch, in order
        for _, group in itertools.groupby(items, key=lambda item: item[0][3]):
            pairs = list(group)
            _, epoch, position, _ = pairs[0][0]
            chunk = [example for _, example in pairs]
            try:  # a collate that draws (a random mask, mixup) is seeded by its first example
                if self.seeded:
                    seed_generators(example_seed(self.seed ^ COLLATE_SALT, epoch, position))
                batches.append(self.task.collate(chunk))
            except Exception as error:
                ids = [e.get("id") for e in chunk if isinstance(e, dict)]
                raise LoopError(f"collate() failed on examples {ids[:8]}: "
                                f"{type(error).__name__}: {error}") from error
        return batches


def _worker_context() -> Any:
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else methods[0])


class Feeder:
    """The iterator of prepared updates, started at the run's current data position."""

    def __init__(
        self, dataset: Any, task: TaskContract, order: DataOrder, *, seed: int, microbatch: int,
        replica: dp.Replica, workers: int, prefetch: int, pin_memory: bool,
    ) -> None:
        position = order.copy()
        options: dict[str, Any] = {}
        if workers:  # forked from the run's process, as PyTorch does by default on Linux:
            # nothing is pickled (a lazy dataset need not be), each worker limits torch to
            # one thread (torch's worker loop does), and forking is explicit whatever start
            # method the process that started this run used
            options = {"prefetch_factor": prefetch, "persistent_workers": False,
                       "multiprocessing_context": _worker_context()}
        seeded = draws_randomness(task)
        self.loader = DataLoader(
            SeededExamples(dataset, seed, seeded),
            batch_sampler=UpdateSampler(position, microbatch, replica),
            collate_fn=CollateUpdate(task, seed, seeded),
            num_workers=workers,
            pin_memory=pin_memory,
            # a private generator: creating the loader never draws from the training RNG
            generator=torch.Generator().manual_seed(seed),
            **options,
        )
        self._updates: Iterator[list[Batch]] | None = None
        # Reads and collates here, seeded: the training RNG is kept around them.
        self._preserve = not workers and seeded

    def next(self) -> tuple[list[Batch], float]:
        """The next update's microbatches and the seconds spent waiting for them."""
        began = time.perf_counter()
        if self._updates is None:
            self._updates = iter(self.loader)
        try:
            if self._preserve:
                with PreservedGenerators():
                    batches = next(self._updates)
            else:  # the workers seed their own generators, or nothing draws
                batches = next(self._updates)
        except LoopError as error:  # from a worker: torch puts its traceback before our line
            lines = [line for line in str(error).splitlines() if line.strip()]
            cause = lines[-1].split("LoopError: ", 1)[-1] if lines else str(error)
            raise LoopError(f"loader worker: {cause}") from error
        return batches, time.perf_counter() - began

    def close(self) -> None:
        """Stop the workers now (they would stop with the process anyway)."""
        updates, self._updates = self._updates, None
        shutdown = getattr(updates, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
