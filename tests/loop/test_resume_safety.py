"""Resume never destroys (issue 14): real processes, damaged and moved checkpoints."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from campaign.ledger import Ledger
from tests.support.launch_helpers import invoke
from tests.support.loop_helpers import plan_loop

ROOT = Path(__file__).resolve().parents[2]
FAULTY = "tests.support.tasks.faulty:build"


def _cli(url: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command in this process, in ``cwd``; its run trains in a child of the task host."""
    return invoke(url, *args, cwd=cwd)


def _interrupted(url: str, tmp_path: Path, name: str, at: int = 11) -> tuple[str, Path]:
    """A run interrupted by a real SIGTERM at microbatch ``at``, its artifacts in ``cwd/art``
    (a relative --artifacts, as a user types it)."""
    with Ledger.open(url, create=True) as ledger:
        fault = {"task.fault": "sigterm", "task.at": at,
                 "task.marker": str(tmp_path / f"{name}.signalled")}
        run_id = plan_loop(ledger, name, task=FAULTY, config=fault)[0]
    cwd = tmp_path / "first"
    cwd.mkdir(exist_ok=True)
    done = _cli(url, cwd, "run", run_id, "--artifacts", "art", "--skip-pilot", "--reason", "t")
    assert done.returncode == 1 and "interrupted" in done.stderr, done.stderr
    return run_id, cwd / "art"


def _checkpoints(url: str, name: str) -> list[Path]:
    with Ledger.open(url) as ledger:
        frame = ledger.artifacts(name)
    rows = frame[frame["kind"] == "checkpoint"].sort_values("step")
    return [Path(p) for p in rows["path"]]


def test_resume_from_another_working_directory(sqlite_url: str, tmp_path: Path) -> None:
    run_id, _ = _interrupted(sqlite_url, tmp_path, "elsewhere")
    other = tmp_path / "other"
    other.mkdir()
    done = _cli(sqlite_url, other, "resume", run_id, "--artifacts", "art")
    assert done.returncode == 0, done.stderr
    with Ledger.open(sqlite_url) as ledger:
        assert ledger.run(run_id).status == "completed"


def test_resume_with_the_artifacts_folder_moved(sqlite_url: str, tmp_path: Path) -> None:
    run_id, art = _interrupted(sqlite_url, tmp_path, "moved")
    moved = tmp_path / "new-disk" / "art"
    moved.parent.mkdir()
    shutil.move(str(art), moved)
    done = _cli(sqlite_url, tmp_path, "resume", run_id, "--artifacts", str(moved))
    assert done.returncode == 0, done.stderr


def test_a_flipped_byte_falls_back_and_the_series_is_exact(
    sqlite_url: str, tmp_path: Path
) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        plain = plan_loop(ledger, "plain", task=FAULTY)[0]
    run_id, art = _interrupted(sqlite_url, tmp_path, "flipped")
    reference = _cli(sqlite_url, tmp_path, "run", plain, "--artifacts", str(art),
                     "--skip-pilot", "--reason", "reference")
    assert reference.returncode == 0, reference.stderr
    *_, previous, newest = _checkpoints(sqlite_url, "flipped")
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x01
    newest.write_bytes(bytes(data))
    done = _cli(sqlite_url, tmp_path, "resume", run_id, "--artifacts", str(art))
    assert done.returncode == 0, done.stderr
    with Ledger.open(sqlite_url) as ledger:
        assert ledger.run(run_id).status == "completed"
        events = ledger.events("flipped", run_id=run_id)
        detail = events[events["kind"] == "resume_fallback"]["detail"].iloc[0]
        a = ledger.metrics("plain").set_index(["key", "step"])["value"]
        b = ledger.metrics("flipped").set_index(["key", "step"])["value"]
    assert newest.name in detail and previous.name in detail
    keys = ["train/loss", "train/grad_norm", "val/loss", "val/accuracy"]
    a, b = (x[x.index.get_level_values("key").isin(keys)].sort_index() for x in (a, b))
    assert len(a) == len(b) and (a == b).all(), a[a != b].to_frame('reference').join(
        b[a != b].rename('resumed'))


def test_every_checkpoint_damaged_is_refused_and_nothing_changes(
    sqlite_url: str, tmp_path: Path
) -> None:
    run_id, _ = _interrupted(sqlite_url, tmp_path, "ruined")
    for path in _checkpoints(sqlite_url, "ruined"):
        path.write_bytes(b"not a checkpoint any more")
    with Ledger.open(sqlite_url) as ledger:
        before = (len(ledger.segments("ruined")), len(ledger.events("ruined")))
    done = _cli(sqlite_url, tmp_path, "resume", run_id, "--artifacts", "art")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "none of its" in done.stderr and "checkpoints verifies" in done.stderr
    with Ledger.open(sqlite_url) as ledger:
        assert ledger.run(run_id).status == "interrupted"
        assert (len(ledger.segments("ruined")), len(ledger.events("ruined"))) == before


def test_retention_keeps_only_the_last_checkpoints(sqlite_url: str, tmp_path: Path) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id = plan_loop(ledger, "kept", task="tests.support.tasks.quick:build",
                           hold={"budget.updates": 80, "loop.checkpoint_every": 1},
                           config={"checkpoint.keep_last": 3, "optimizer.name": "sgd"},
                           validation={"every": 40})[0]
    art = tmp_path / "art"
    (art / run_id / "checkpoints").mkdir(parents=True)
    (art / run_id / "checkpoints" / ".step-00000001.safetensors.999.partial").write_bytes(b"x")
    done = _cli(sqlite_url, tmp_path, "run", run_id, "--artifacts", str(art), "--skip-pilot",
                "--reason", "retention")
    assert done.returncode == 0, done.stderr
    files = sorted(p.name for p in (art / run_id / "checkpoints").iterdir())
    assert files == [f"step-{s:08d}.safetensors" for s in (78, 79, 80)]
    with Ledger.open(sqlite_url) as ledger:
        frame = ledger.artifacts("kept")
    assert (frame["kind"] == "checkpoint").sum() == 80  # the rows stay: a ledger never forgets
    assert frame[frame["kind"] == "checkpoint"]["step"].is_unique  # the last one saved once
