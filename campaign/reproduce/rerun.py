"""``campaign reproduce ARCHIVE``: a run re-executed from its archive alone, and compared.

The archive is verified, unpacked (:mod:`campaign.reproduce.unpack`), its frozen spec planned
into a fresh SQLite ledger in the new folder, and each chosen run (the same variant and seed)
executed on the CPU from the unpacked working folder, through the same ``plan`` and ``run``
commands a user types (one task host for both). Then every recorded metric but the timings is
compared bit for bit with the archive's (the highest segment per update, as the ledger reads),
and the final artifact's tensors by SHA-256 (the file's own bytes name the run id and the
times, so they differ by construction). Bit-for-bit equality is what the CPU promises for a
run that trained on the CPU with the same thread count; a run trained on a GPU is compared
and its differences reported, not expected to vanish.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from campaign.errors import UntrustedCode
from campaign.ledger import Ledger
from campaign.reproduce.unpack import (
    ReproduceError,
    Unpacked,
    inside,
    read_json,
    relocated_spec,
    unpack,
)
from campaign.stack.project import sha256_file
from campaign.stack.software import THREAD_VARIABLES, stack_differences

TIMINGS = ("_s",)  # train/update_s, train/data_wait_s: wall clock, never reproducible


@dataclasses.dataclass(frozen=True)
class Comparison:
    original: str
    reproduced: str
    status: str
    points: int
    differing: list[str]  # "key at update N: a != b", first few
    weights_original: str | None
    weights_reproduced: str | None
    environment: list[str] = dataclasses.field(default_factory=list)  # where metrics differ

    @property
    def identical(self) -> bool:
        return (self.status in ("completed", "stopped") and not self.differing
                and self.weights_original == self.weights_reproduced)


def reproduce(archive: Path, folder: Path, run_id: str | None, invoke: Callable[..., None],
              *, trust: bool, say: Callable[[str], None],
              ) -> tuple[list[Comparison], tuple[tuple[str, str, str], ...]]:
    """Re-execute ``run_id`` (else every completed or stopped run) of ``archive`` in ``folder``;
    ``invoke(arguments, quiet=False)`` runs a ``campaign`` command line in this process (the
    command line's own, passed down: this package sits below it). The archive's own task code
    (not a built-in task of this installation) is said by ``say``, file by file with its
    SHA-256, and run only when ``trust`` (else :class:`UntrustedCode`, before anything ran).
    Returns the comparisons and the settings pointed at data placed from outside the runs'
    working folder."""
    unpacked = unpack(archive, folder)
    frozen = read_json(unpacked.members, "spec.json", "no spec.json in the archive")
    _trusted_or_refused(unpacked, frozen, trust, say)
    try:
        runs = pd.read_parquet(unpacked.members / "runs.parquet")
    except (OSError, ValueError) as error:  # (pyarrow's ArrowInvalid is a ValueError)
        raise ReproduceError(f"runs.parquet: not the runs' table ({error})") from None
    chosen = _chosen(runs, run_id)
    spec = unpacked.work / "spec.json"
    spec.write_text(json.dumps(relocated_spec(frozen, unpacked.moved), indent=2))
    described = read_json(unpacked.members, "campaign.json", "no campaign.json in the archive")
    name = described.get("name") if isinstance(described, dict) else None
    if not isinstance(name, str):
        raise ReproduceError("campaign.json: no campaign name in it")
    url = f"sqlite:///{(folder / 'ledger.db').absolute()}"
    comparisons = []
    with contextlib.chdir(unpacked.work), _importable(unpacked.imports):  # as the runs had them
        invoke(["--ledger", url, "plan", str(spec)], quiet=True)
        with Ledger.open(url) as ledger:
            fresh = ledger.runs(name)
        for original in chosen.itertuples():
            match = fresh[(fresh["variant"] == original.variant) & (fresh["seed"] == original.seed)]
            if match.empty:
                raise ReproduceError(f"run {original.run_id}: variant {original.variant!r} seed "
                                     f"{original.seed} is not in the archive's spec")
            new_id = str(match["run_id"].iloc[0])
            recorded = _recorded_environment(unpacked.members, str(original.run_id))
            with _threads_of(recorded):  # a reduction's last bit can depend on them
                invoke(["--ledger", url, "run", new_id, "--device", "cpu", "--skip-pilot",
                        "--reason", f"reproducing run {original.run_id} from {archive.name}",
                        "--artifacts", str(unpacked.artifacts)])
            comparison = _compare(unpacked, url, str(original.run_id), new_id)
            if comparison.differing:
                with Ledger.open(url) as ledger:
                    mine = ledger.runs(name)
                here = mine.loc[mine["run_id"] == new_id, "environment"].iloc[0] or {}
                comparison = dataclasses.replace(
                    comparison, environment=environment_differences(recorded, here))
            comparisons.append(comparison)
    return comparisons, unpacked.moved


# What Python can import or run from a folder on its path: any of these placed under the
# working folder (which a command's task host has on its path) is the archive's code.
CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyd", ".so", ".pth")
BUILT_IN_TASKS = "campaign.tasks."


def _trusted_or_refused(unpacked: Unpacked, spec: Any, trust: bool,
                        say: Callable[[str], None]) -> None:
    """The archive's code is every importable file it placed under the working folder (its
    task's sources, and anything its data entries put there: a ``torch.py`` would shadow
    torch) and a task that is not one of this installation's built-ins. Each is said with its
    SHA-256; without ``trust`` any of it is :class:`UntrustedCode`, before anything ran."""
    task = (spec.get("campaign") or {}).get("task") if isinstance(spec, dict) else None
    if not isinstance(task, str):
        raise ReproduceError("spec.json: no campaign.task in it")
    placed = sorted(p for p in unpacked.work.rglob("*")
                    if p.suffix in CODE_SUFFIXES and p.is_file())
    for path in placed:
        say(f"the archive's code: {path.relative_to(unpacked.work)} (sha256 "
            f"{sha256_file(path)})")
    if trust or (not placed and task.startswith(BUILT_IN_TASKS)):
        return
    what = (", ".join(str(p.relative_to(unpacked.work)) for p in placed) if placed
            else f"its task {task}")
    raise UntrustedCode(f"the archive's code ({what}) would run on this machine: read it, "
                        "then pass --trust-task-code")


def _recorded_environment(members: Path, run_id: str) -> dict[str, Any]:
    """The software stack the run recorded (``runs/RUN_ID/environment.json``), or nothing."""
    try:
        inside(members, f"runs/{run_id}/environment.json", f"run {run_id}")
        found = read_json(members, f"runs/{run_id}/environment.json", "")
    except ReproduceError:
        return {}
    return found if isinstance(found, dict) else {}


@contextlib.contextmanager
def _importable(folders: tuple[str, ...]) -> Iterator[None]:
    """The folders a run's local modules were imported from (its ``_roots/N``) on this
    process's path and its commands' ``PYTHONPATH``, for the reproduction only."""
    if not folders:
        yield
        return
    saved_path, saved = list(sys.path), os.environ.get("PYTHONPATH")
    sys.path[:0] = folders
    os.environ["PYTHONPATH"] = os.pathsep.join([*folders, *([saved] if saved else [])])
    try:
        yield
    finally:
        sys.path[:] = saved_path
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@contextlib.contextmanager
def _threads_of(environment: dict[str, Any]) -> Iterator[None]:
    """The run's own torch thread count for its reproduction (the thread variables,
    which its fresh process reads), the caller's after."""
    intra = (environment.get("threads") or {}).get("intra_op")
    if not isinstance(intra, int) or not 1 <= intra <= 4096:  # an archive's number, bounded
        yield
        return
    saved = {name: os.environ.get(name) for name in THREAD_VARIABLES}
    os.environ.update({name: str(intra) for name in THREAD_VARIABLES})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def environment_differences(run: dict[str, Any], here: dict[str, Any]) -> list[str]:
    """What differs between the environment a run recorded and its reproduction's: the
    likely cause of a difference in the last bits (the stack a launch compares with its
    pilots', then the packages and torch's thread count; the host's name aside)."""
    differences = stack_differences(run, here, was="run")
    packages = sorted(set(run.get("packages") or {}) | set(here.get("packages") or {}))
    pairs = [(f"package {name}", (run.get("packages") or {}).get(name),
              (here.get("packages") or {}).get(name)) for name in packages]
    pairs.append(("torch threads", (run.get("threads") or {}).get("intra_op"),
                  (here.get("threads") or {}).get("intra_op")))
    return differences + [f"{key}: run {a!r}, now {b!r}" for key, a, b in pairs if a != b]


def _chosen(runs: pd.DataFrame, run_id: str | None) -> pd.DataFrame:
    missing = [c for c in ("run_id", "status", "variant", "seed") if c not in runs.columns]
    if missing:
        raise ReproduceError(f"runs.parquet: no {missing[0]} column: not the runs' table")
    done = runs[runs["status"].isin(["completed", "stopped"])]
    if run_id is None:
        if done.empty:
            raise ReproduceError("the archive holds no completed or stopped run to reproduce")
        return done
    if run_id not in set(runs["run_id"]):
        raise ReproduceError(f"run {run_id} is not in the archive")
    if run_id not in set(done["run_id"]):
        status = runs.loc[runs["run_id"] == run_id, "status"].iloc[0]
        raise ReproduceError(f"run {run_id} is {status}: only a completed or stopped run has a "
                             "final artifact to reproduce")
    return done[done["run_id"] == run_id]


def _compare(unpacked: Unpacked, url: str, original: str, new_id: str) -> Comparison:
    try:
        archived = pd.read_parquet(unpacked.members / "metrics.parquet",
                                   columns=["run_id", "segment_id", "key", "step", "value"])
    except (OSError, ValueError, KeyError) as error:  # (ArrowInvalid is a ValueError)
        raise ReproduceError(f"metrics.parquet: not the runs' metrics ({error})") from None
    archived = archived[archived["run_id"] == original]
    archived = archived.sort_values("segment_id").drop_duplicates(["key", "step"], keep="last")
    with Ledger.open(url) as ledger:
        record = ledger.run(new_id)
        fresh = ledger.metrics(record.campaign, runs=[new_id])
        artifacts = ledger.artifacts(record.campaign)
    merged = archived.merge(fresh, on=["key", "step"], how="outer", suffixes=("_a", "_b"))
    merged = merged[~merged["key"].str.endswith(TIMINGS)].sort_values(["step", "key"])
    a, b = merged["value_a"].to_numpy(float), merged["value_b"].to_numpy(float)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    differing = [f"{row.key} at update {row.step}: {row.value_a!r} != {row.value_b!r}"
                 for row in merged[~same].head(5).itertuples()]
    finals = sorted(inside(unpacked.members, f"finals/{original}", f"run {original}")
                    .glob("*.safetensors"))
    mine = artifacts[(artifacts["run_id"] == new_id) & (artifacts["kind"] == "final")]
    try:
        archived_weights = tensors_sha256(finals[-1]) if finals else None
    except (OSError, ValueError) as error:  # (safetensors' own error is a ValueError kind)
        raise ReproduceError(f"the final artifact of run {original} in the archive cannot be "
                             f"read ({error})") from None
    return Comparison(original, new_id, record.status, len(merged), differing,
                      archived_weights,
                      tensors_sha256(Path(mine["path"].iloc[-1])) if len(mine) else None)


def tensors_sha256(path: Path) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order."""
    from safetensors import safe_open

    digest = hashlib.sha256()
    with safe_open(str(path), "np") as handle:
        for key in sorted(handle.keys()):
            tensor = handle.get_tensor(key)
            digest.update(f"{key}|{tensor.dtype}|{tensor.shape}".encode())
            digest.update(np.ascontiguousarray(tensor).tobytes())
    return digest.hexdigest()
