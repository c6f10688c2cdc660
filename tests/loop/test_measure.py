"""CPU phase memory: each phase gets its own RSS peak (the twin of tests/loop/test_gpu.py's CUDA
counters), so a pilot's rss_peak is the phase's, not whatever the process once reached."""

from __future__ import annotations

import torch

from campaign.loop.measure import Probe, rss_bytes

MIB = 1 << 20


def test_cpu_phase_peaks_are_each_phase_own_and_reset() -> None:
    probe = Probe(torch.device("cpu"))
    before, _ = rss_bytes()
    with probe.phase("allocate"):
        scratch = torch.ones(64 * MIB)  # 256 MiB touched (float32), freed inside the phase
        del scratch
    with probe.phase("small"):
        torch.ones(16)
    big, small = probe.drain()
    assert big.rss_peak >= before + 200 * MIB, (before, big)
    assert big.rss < before + 100 * MIB  # returned to the system: only the peak remembers it
    assert small.rss_peak < big.rss_peak - 200 * MIB  # the peak was reset between phases
    assert small.rss_peak >= small.rss > 0
