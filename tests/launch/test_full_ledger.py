"""A full or read-only SQLite ledger stops the claiming, not the runs (docs/runs.md, faults).
The ledger lives on a small volume of the test's own (tmpfs, mounted here): filled to the
last byte, or remounted read-only, a worker claims nothing and says which file and why, and
every run stays planned; a run training when its volume fills waits for the space and ends
as its uninterrupted twin, every point once. Real mounts (needs root, as CI has)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from campaign.ledger import Ledger
from tests.conftest import REQUIRE_ALL
from tests.support.launch_helpers import invoke
from tests.support.loop_helpers import plan_quick
from tests.support.outages import SKIP, ridden_out


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs mounted on a folder of this test; unmounted afterwards."""
    if os.geteuid() != 0 and not REQUIRE_ALL:
        pytest.skip("capability: mounting a volume needs root")
    folder = tmp_path / "volume"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _fill(volume: Path) -> Path:
    """Take every free byte of ``volume`` with one file; returns it (delete it to free)."""
    filler = volume / "filler"
    # Unbuffered: a buffered file keeps the bytes a full volume refused and raises ENOSPC
    # again as it closes (seen in CI).
    with open(filler, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(bytes(64 * 1024))
        except OSError:
            pass
    return filler


def _worker(url: str, campaign: str, artifacts: Path) -> subprocess.CompletedProcess[str]:
    return invoke(url, "worker", campaign, "--artifacts", str(artifacts), "--no-replay-check",
                  *SKIP)


def test_a_full_ledger_volume_claims_nothing_and_says_so(volume: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{volume / 'campaign.db'}"
    with Ledger.open(url, create=True) as ledger:
        plan_quick(ledger, "full", runs=3, updates=3)
    filler = _fill(volume)
    done = _worker(url, "full", tmp_path / "artifacts")
    assert done.returncode == 3, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert str(volume / "campaign.db") in line and "its volume is full" in line
    assert "no run was claimed" in line
    filler.unlink()
    with Ledger.open(url) as ledger:
        assert set(ledger.runs("full")["status"]) == {"planned"}  # not one seed burned
    assert _worker(url, "full", tmp_path / "artifacts").returncode == 0  # space again: all run


def test_a_read_only_ledger_volume_claims_nothing_and_says_so(volume: Path,
                                                              tmp_path: Path) -> None:
    url = f"sqlite:///{volume / 'campaign.db'}"
    with Ledger.open(url, create=True) as ledger:
        (run_id, *_) = plan_quick(ledger, "ro", runs=3, updates=3)
    subprocess.run(["mount", "-o", "remount,ro", str(volume)], check=True)
    done = _worker(url, "ro", tmp_path / "artifacts")
    assert done.returncode == 3, done.stderr
    assert "mounted read-only" in done.stderr and str(volume / "campaign.db") in done.stderr
    ran = invoke(url, "run", run_id, "--artifacts", str(tmp_path / "artifacts"), *SKIP)
    assert ran.returncode == 3 and "mounted read-only" in ran.stderr, ran.stderr
    subprocess.run(["mount", "-o", "remount,rw", str(volume)], check=True)
    with Ledger.open(url) as ledger:
        assert set(ledger.runs("ro")["status"]) == {"planned"}


@pytest.mark.slow
def test_a_run_waits_out_its_ledger_volume_filling_and_ends_as_its_twin(
        volume: Path, tmp_path: Path) -> None:
    def fill_then_free() -> None:
        filler = _fill(volume)
        time.sleep(4)  # the run meets the full volume at its next flush
        filler.unlink()

    ridden_out(f"sqlite:///{volume / 'campaign.db'}", tmp_path, fill_then_free)
