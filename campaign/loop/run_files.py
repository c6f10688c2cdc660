"""Files a run writes beside the ledger (predictions, tracebacks, checkpoints, the final
artifact), each recorded as an artifact row with its SHA-256 and size.

Files are written under a temporary name and renamed into place, so a crash
never leaves a file that looks complete; the row is added only once the file
is whole, so every artifact row names a file whose hash was taken from disk.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from campaign.ledger import Ledger
from campaign.loop.checkpoint_file import file_sha256


def record_file(
    ledger: Ledger,
    run_id: str,
    kind: str,
    path: Path,
    step: int,
    *,
    lease: str | None,
    sha256: str | None = None,
    mark: Any = None,
) -> int:
    """Add the artifact row of a file already written (its hash taken now unless given;
    ``mark``: that of an earlier attempt, ledger/evidence.py).

    The path is recorded absolute: a resume from another working directory finds it (and
    one given another ``--artifacts`` folder finds it there, see :func:`locate`)."""
    digest = sha256 if sha256 is not None else file_sha256(path)
    return ledger.add_artifact(
        run_id, kind, str(path.absolute()), digest, path.stat().st_size, step, lease=lease,
        mark=mark)


def record_log(ledger: Ledger, run_id: str, path: Path, step: int, *, lease: str | None) -> None:
    """Record the supervised process's output (its stdout and stderr) as the run's ``log``
    artifact, then send later output nowhere: the recorded hash stays the file's."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    if not path.exists():
        return
    record_file(ledger, run_id, "log", path, step, lease=lease)
    sink = os.open(os.devnull, os.O_WRONLY)
    os.dup2(sink, 1)
    os.dup2(sink, 2)
    os.close(sink)


def locate(stored: str, artifacts: Path, run_id: str) -> Path:
    """Where an artifact is now: its recorded path, else the same file under ``artifacts``
    (the folder moved, or an old relative path read from another working directory)."""
    path = Path(stored)
    if path.exists():
        return path
    parts = path.parts
    if run_id in parts:
        moved = Path(artifacts, *parts[parts.index(run_id):])
        if moved.exists():
            return moved
    return path


def write_predictions(path: Path, records: Sequence[dict[str, Any]]) -> Path:
    """Validation predictions as Parquet (id, prediction, target), written atomically."""
    import pandas as pd  # here: a worker and its supervisor import this module, not pandas

    path.parent.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame.from_records(
        [
            {"id": r["id"], "prediction": str(r["prediction"]), "target": str(r["target"])}
            for r in records
        ],
        columns=["id", "prediction", "target"],
    )
    temporary = path.with_suffix(".partial")
    frame.to_parquet(temporary, index=False)
    os.replace(temporary, path)
    return path


def save_traceback(
    ledger: Ledger, run_id: str, folder: Path, step: int, *, lease: str | None
) -> int | None:
    """The exception being handled, as the run's ``traceback`` artifact; None when it could not
    be written (a courtesy: the run still ends as failed)."""
    try:
        path = write_traceback(folder / "traceback.txt")
        return record_file(ledger, run_id, "traceback", path, step, lease=lease)
    except Exception:
        return None


def write_traceback(path: Path) -> Path:
    """The exception being handled, as text (called from an ``except`` block)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(traceback.format_exc())
    return path


@contextlib.contextmanager
def artifacts_environment(folder: Path) -> Iterator[None]:
    """``CAMPAIGN_ARTIFACTS`` set to ``folder`` for the block (and the processes it starts),
    as a run's process has it; restored after."""
    before = os.environ.get("CAMPAIGN_ARTIFACTS")
    os.environ["CAMPAIGN_ARTIFACTS"] = str(folder.absolute())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CAMPAIGN_ARTIFACTS", None)
        else:
            os.environ["CAMPAIGN_ARTIFACTS"] = before
