"""Checkpoints are safe: torn, tampered and pickled files refused; kill -9 leaves no torn file."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import random
import signal
import time
from pathlib import Path

import pytest
import torch

from campaign.ledger import Ledger
from campaign.loop import checkpoint as ckpt
from campaign.loop.train import execute
from tests.support import checkpoint_writer
from tests.support.loop_helpers import plan_loop

ROOT = Path(__file__).resolve().parents[2]


def _saved(folder: Path) -> ckpt.SavedCheckpoint:
    tensors = {"w": torch.arange(10, dtype=torch.float32)}
    return ckpt.save(folder / "step-00000001.safetensors", tensors, {"step": 1, "note": "ok"})


def test_round_trip_and_hash_check(tmp_path: Path) -> None:
    saved = _saved(tmp_path)
    tensors, state = ckpt.load(saved.path, saved.sha256)
    assert torch.equal(tensors["w"], torch.arange(10, dtype=torch.float32))
    assert state["note"] == "ok" and state["step"] == 1
    with pytest.raises(ckpt.CheckpointError, match="does not match the ledger"):
        ckpt.load(saved.path, "0" * 64)


def test_corrupted_and_truncated_files_are_refused(tmp_path: Path) -> None:
    saved = _saved(tmp_path)
    data = bytearray(saved.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    saved.path.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match="does not match the ledger"):
        ckpt.load(saved.path, saved.sha256)
    saved.path.write_bytes(bytes(data[: len(data) // 3]))
    with pytest.raises(ckpt.CheckpointError, match="does not match the ledger"):
        ckpt.load(saved.path, saved.sha256)
    with pytest.raises(ckpt.CheckpointError, match="not a readable campaign checkpoint"):
        ckpt.load(saved.path, None)  # even without a recorded hash: the parser refuses


class _Payload:
    """Unpickling this runs a shell command: the test proves it never runs."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_offered_as_a_checkpoint_never_runs(tmp_path: Path, sqlite_url: str) -> None:
    marker = tmp_path / "payload-ran"
    evil = tmp_path / "step-00000004.safetensors"
    evil.write_bytes(pickle.dumps({"model": _Payload(marker)}))
    with pytest.raises(ckpt.CheckpointError, match="not a readable campaign checkpoint"):
        ckpt.load(evil, ckpt.file_sha256(evil))
    # And through a resume, with the pickle registered in the ledger under its true hash:
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id = plan_loop(ledger)[0]
        claim = ledger.start(run_id, "w")
        ledger.add_artifact(
            run_id, "checkpoint", str(evil), ckpt.file_sha256(evil), evil.stat().st_size, 4
        )
        from campaign.ledger import StopRecord

        ledger.finish(run_id, "interrupted", StopRecord("interrupted", 4, "update"))
        assert claim.ordinal == 1
        with pytest.raises(ckpt.CheckpointError, match="not a readable campaign checkpoint"):
            execute(ledger, run_id, artifacts=tmp_path, replay_in_subprocess=False)
        assert ledger.run(run_id).status == "interrupted"  # refused before it was taken
        assert list(ledger.segments("loop")["ordinal"]) == [1]
    assert not marker.exists()


def test_a_resume_passes_over_a_checkpoint_changed_after_recording(
    tmp_path: Path, sqlite_url: str
) -> None:
    """The newest checkpoint changed after the ledger recorded it (a byte flipped; truncated,
    or a 1 TiB sparse file in its place, or a FIFO, each refused unread): the resume falls
    back to the one before, names both, and the run completes; nothing is lost."""
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id = plan_loop(
            ledger,
            task="tests.support.tasks.faulty:build",
            config={"task.fault": "sigterm", "task.at": 11, "task.marker": str(tmp_path / "m")},
        )[0]
        execute(ledger, run_id, artifacts=tmp_path / "a", replay_in_subprocess=False)
        assert ledger.run(run_id).status == "interrupted"
        frame = ledger.artifacts("loop")
        checkpoints = frame[frame["kind"] == "checkpoint"].sort_values("step")
        newest, previous = (Path(p) for p in checkpoints["path"].iloc[[-1, -2]])
        content = bytearray(newest.read_bytes())
        content[-10] ^= 0xFF  # one byte changed after the ledger recorded it
        newest.write_bytes(bytes(content))
        outcome = execute(ledger, run_id, artifacts=tmp_path / "a", replay_in_subprocess=False)
        assert outcome.status == "completed"
        events = ledger.events("loop", run_id=run_id)
        fallback = events[events["kind"] == "resume_fallback"]["detail"].iloc[0]
        assert str(newest) in fallback and str(previous) in fallback
        assert "differs from the recorded" in fallback
        resumed = ledger.segments("loop").iloc[-1]
        assert int(resumed["start_step"]) == int(checkpoints["step"].iloc[-2])


@pytest.mark.slow
def test_kill_9_while_saving_never_leaves_a_torn_checkpoint(tmp_path: Path) -> None:
    # Writers are forked from one fork server that imported torch once: each attempt is a
    # real process killed with SIGKILL, without paying a torch import per attempt.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.support.checkpoint_writer"])
    rng = random.Random(1234)
    torn_writes = 0
    for attempt in range(30):
        folder = tmp_path / f"attempt-{attempt}"
        folder.mkdir()
        receive, send = context.Pipe(duplex=False)
        writer = context.Process(target=checkpoint_writer.main, args=(str(folder), send))
        writer.start()
        assert receive.poll(120), "the writer never finished its first checkpoint"
        time.sleep(rng.uniform(0.0, 0.15))
        os.kill(writer.pid, signal.SIGKILL)
        writer.join()
        assert writer.exitcode == -signal.SIGKILL
        torn_writes += len(list(folder.glob(".step-*.partial")))  # killed mid-write
        finished = sorted(folder.glob("step-*.safetensors"))
        newest = finished[-1]
        tensors, state = ckpt.load(newest, None)
        step = state["step"]
        assert newest.name == f"step-{step:08d}.safetensors"
        assert torch.equal(tensors["weights"], torch.full((512, 1024), float(step)))
        assert torch.equal(tensors["bias"], torch.arange(1000, dtype=torch.float64) * step)
    assert torn_writes > 0, "no kill landed during a write: the test proved nothing"



@pytest.mark.parametrize("planted", ["sparse", "fifo", "truncated"])
def test_a_file_that_is_not_the_recorded_checkpoint_is_refused_unread(
        tmp_path: Path, sqlite_url: str, planted: str) -> None:
    """A checkpoint's place taken by a 1 TiB sparse file (minutes of hashing before), a FIFO
    (a read that never ends) or a shorter file: the size the ledger recorded and the file's
    type say so before a byte is read."""
    import os

    from campaign.loop.resume import choose_resume_point

    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id = plan_loop(
            ledger, task="tests.support.tasks.faulty:build",
            config={"task.fault": "sigterm", "task.at": 11, "task.marker": str(tmp_path / "m")},
        )[0]
        execute(ledger, run_id, artifacts=tmp_path / "a", replay_in_subprocess=False)
        frame = ledger.artifacts("loop")
        checkpoints = frame[frame["kind"] == "checkpoint"].sort_values("step")
        newest = Path(checkpoints["path"].iloc[-1])
        newest.unlink()
        if planted == "sparse":
            with open(newest, "wb") as handle:
                handle.truncate(1 << 40)
        elif planted == "fifo":
            os.mkfifo(newest)
        else:
            newest.write_bytes(b"short")
        point = choose_resume_point(ledger, "loop", run_id, ledger.run(run_id).config_sha256,
                                    tmp_path / "a")  # (hashing 1 TiB took minutes; a FIFO hung)
        assert point.checkpoint is not None
        assert point.checkpoint["step"] == int(checkpoints["step"].iloc[-2])
        (skipped,) = point.skipped
        assert "refused unread" in skipped and str(newest) in skipped
