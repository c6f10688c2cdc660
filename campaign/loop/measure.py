"""Per-phase measurement: duration and memory, for the loop and the pilot (docs/report.md,
pilot phases).

On CUDA, allocated and reserved memory are different counters and are never
added: each phase synchronises, resets the peaks, records the baseline, and
after the phase records current and peak of both, per device. On CPU the
process RSS and its peak are recorded; Linux lets a process reset its peak
(``/proc/self/clear_refs``), so each phase gets its own peak where allowed.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass
class PhaseRecord:
    """One row of ``phase_measurements`` (without its run or pilot id)."""

    phase: str
    device: str
    inputs: dict[str, Any] = field(default_factory=dict)
    duration_s: float | None = None
    allocated: int | None = None
    allocated_peak: int | None = None
    reserved: int | None = None
    reserved_peak: int | None = None
    baseline_allocated: int | None = None
    rss: int | None = None
    rss_peak: int | None = None
    verdict: str | None = "measured"
    detail: str | None = None
    # Timed repetitions of the phase's work (after a warm-up): the duration is their median,
    # so one slow first call (lazy initialisation, a page fault storm) is not the figure.
    repeats: list[float] = field(default_factory=list)

    def row(self, **owner: Any) -> dict[str, Any]:
        row = asdict(self)
        del row["repeats"]
        return {**row, **owner}


def rss_bytes() -> tuple[int, int]:
    """(current RSS, peak RSS) of this process, from /proc on Linux."""
    current = peak = 0
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    current = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
    except OSError:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        current = peak
    return current, peak


def _reset_rss_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass  # not Linux or not allowed: the peak is then the process's peak so far


class Probe:
    """Measures phases on one device; ``sampled`` decides which calls are measured."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.records: list[PhaseRecord] = []

    @contextmanager
    def phase(
        self, name: str, inputs: Mapping[str, Any] | None = None, measure: bool = True
    ) -> Iterator[PhaseRecord | None]:
        if not measure:
            yield None
            return
        record = PhaseRecord(name, str(self.device), dict(inputs or {}))
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            record.baseline_allocated = torch.cuda.memory_allocated(self.device)
        else:
            _reset_rss_peak()
        start = time.perf_counter()
        try:
            yield record
        finally:
            if self.cuda:
                torch.cuda.synchronize(self.device)
            record.duration_s = time.perf_counter() - start
            if record.repeats:
                record.duration_s = statistics.median(record.repeats)
                record.inputs["repetitions"] = len(record.repeats)
                record.inputs["range_s"] = [round(min(record.repeats), 6),
                                            round(max(record.repeats), 6)]
            if self.cuda:
                record.allocated = torch.cuda.memory_allocated(self.device)
                record.allocated_peak = torch.cuda.max_memory_allocated(self.device)
                record.reserved = torch.cuda.memory_reserved(self.device)
                record.reserved_peak = torch.cuda.max_memory_reserved(self.device)
            record.rss, record.rss_peak = rss_bytes()
            self.records.append(record)

    def timed(self, record: PhaseRecord, work: Any, times: int) -> Any:
        """Run ``work`` ``times`` times, each timed (synchronised on CUDA) into
        ``record.repeats``; returns the last result."""
        result = None
        for _ in range(times):
            if self.cuda:
                torch.cuda.synchronize(self.device)
            start = time.perf_counter()
            result = work()
            if self.cuda:
                torch.cuda.synchronize(self.device)
            record.repeats.append(time.perf_counter() - start)
        return result

    def drain(self) -> list[PhaseRecord]:
        records, self.records = self.records, []
        return records
