"""CUDA-only paths: memory counters per phase, fp16 with a GradScaler. Marked ``gpu``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from campaign.ledger import Ledger
from campaign.loop.measure import Probe
from campaign.loop.train import execute
from tests.support.loop_helpers import plan_loop

pytestmark = pytest.mark.gpu


def test_cuda_phase_counters_are_separate_and_reset() -> None:
    probe = Probe(torch.device("cuda"))
    keep = torch.zeros(1 << 20, device="cuda")  # 4 MiB held across phases
    with probe.phase("allocate"):
        scratch = torch.ones(1 << 22, device="cuda")  # 16 MiB peak inside the phase
        del scratch
    with probe.phase("small"):
        torch.ones(16, device="cuda")
    big, small = probe.drain()
    assert big.allocated_peak >= big.baseline_allocated + (1 << 24)
    assert small.allocated_peak < big.allocated_peak  # the peak was reset between phases
    assert big.reserved_peak >= big.allocated_peak  # reserved is its own counter
    del keep


def test_fp16_run_with_grad_scaler_on_cuda(sqlite_url: str, tmp_path: Path) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id = plan_loop(ledger, hold={"loop.precision": "fp16"})[0]
        outcome = execute(
            ledger, run_id, artifacts=tmp_path, device="cuda", replay_in_subprocess=False
        )
        assert outcome.status == "completed", outcome
        phases = ledger.phases("loop")
        files = ledger.artifacts("loop").query("kind == 'checkpoint'")
    updates = phases[phases["phase"].isin(["update", "update_first"])]
    assert len(updates) and updates["allocated_peak"].notna().all()
    from campaign.loop import checkpoint as ckpt

    _, state = ckpt.load(Path(files["path"].iloc[-1]), files["sha256"].iloc[-1])
    scaler = state["scaler"]  # the GradScaler really ran: its state was saved with its scale
    assert scaler and float(scaler["scale"]) > 0 and int(scaler["_growth_tracker"]) >= 0


def test_pilot_on_cuda_stores_allocated_and_reserved_apart(sqlite_url: str, tmp_path: Path) -> None:
    from campaign.pilot.phase_gates import run_pilot

    with Ledger.open(sqlite_url, create=True) as ledger:
        plan_loop(ledger)
        report = run_pilot(ledger, "loop", artifacts=tmp_path, device="cuda")
        assert report.passed, [(r.phase, r.detail) for r in report.records]
        phases = ledger.phases("loop")
        trained = phases[phases["phase"].isin(["forward", "backward", "update_first"])]
        assert trained["allocated_peak"].notna().all() and trained["reserved_peak"].notna().all()
        assert (trained["reserved_peak"] >= trained["allocated_peak"]).all()
