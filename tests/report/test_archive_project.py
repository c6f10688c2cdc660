"""An archive holds the project a run used (issue 42, item 1): a task ported from someone
else's script imports that script as a sibling module and reads its data file by a relative
path. The run records both (the module in its source digest, the file by SHA-256), the archive
packs both, ``verify-archive`` fails when either is absent, and ``reproduce`` of the archive
alone, the project moved away, trains the run again bit for bit. On SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.launch_helpers import in_process, reproduced_elsewhere

NAME = "ported"

ORIGINAL = '''"""Someone else's training script: its model and data reader, kept as they were."""
import torch

HIDDEN = 8


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(2, HIDDEN), torch.nn.Tanh(),
                                        torch.nn.Linear(HIDDEN, 1))

    def forward(self, x):
        return self.body(x)


def read_points(path):
    rows = []
    with open(path) as handle:
        next(handle)
        for line in handle:
            name, a, b, y = line.strip().split(",")
            rows.append((name, float(a), float(b), float(y)))
    return rows
'''

TASK = '''"""The script ported as a task: its model and reader imported, its data read by a relative
path from the working folder."""
import numpy as np
import torch

import campaign
import original_script_ENGINE as original_script


class Ported(campaign.Task):
    kind, target = "regression", "y"

    def model(self):
        return original_script.Net()

    def splits(self):
        rows = [{"id": name, "x": np.array([a, b], dtype=np.float32), "y": y}
                for name, a, b, y in original_script.read_points("data/points.csv")]
        return {"train": rows[:48], "val": rows[48:]}

    def loss(self, model, batch):
        predicted = self.outputs(model, batch).reshape(-1)
        target = batch["y"].to(predicted.dtype)
        return torch.nn.functional.mse_loss(predicted, target, reduction="sum"), len(target)


def build(config):
    return Ported(config)
'''

SPEC = '''[campaign]
name = "ported"
question = "Does the ported script's model fit its points?"
task = "ported_task_{engine}:build"

[hold]
"loop.microbatch" = 8
"budget.updates" = 12

[config]
"optimizer.name" = "adamw"
"optimizer.lr" = 1e-2

[validation]
every = 6
metric = "val/mse"
mode = "min"

[grid]
seeds = [0]
control = "base"

[[grid.variants]]
name = "base"
set = { "optimizer.lr" = 1e-2 }
'''


def _project(folder: Path, engine: str) -> None:
    """The project, its module names told apart by engine (the test process and its task host
    import both projects' modules: one name would be the first one's)."""
    folder.mkdir()
    (folder / f"original_script_{engine}.py").write_text(ORIGINAL)
    (folder / f"ported_task_{engine}.py").write_text(TASK.replace("ENGINE", engine))
    (folder / "spec.toml").write_text(SPEC.replace("{engine}", engine))
    (folder / "data").mkdir()
    lines = ["name,a,b,y"]
    for i in range(64):
        a, b = (i % 8) / 4 - 1, (i // 8) / 4 - 1
        lines.append(f"p{i},{a},{b},{3 * a - 2 * b + 0.5}")
    (folder / "data" / "points.csv").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def ported(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str, str]]:
    """The project, planned and its one run trained; (folder, run id, ledger URL)."""
    folder = tmp_path_factory.mktemp(f"project-{request.param}") / NAME
    _project(folder, request.param)
    if request.param == "sqlite":
        url = f"sqlite:///{folder.parent / 'ledger.db'}"
        yield from _trained(folder, url)
        return
    from psycopg import sql

    from tests.conftest import POSTGRES_ADMIN_URL, _admin_connection

    database = f"campaign_test_ported_{uuid.uuid4().hex[:12]}"  # one per xdist worker
    with _admin_connection() as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(database)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    try:
        yield from _trained(folder, f"{base}/{database}")
    finally:
        with _admin_connection() as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(database)))


def _trained(folder: Path, url: str) -> Iterator[tuple[Path, str, str, str]]:
    assert in_process("--ledger", url, "plan", "spec.toml", cwd=folder).returncode == 0
    listed = in_process("--ledger", url, "runs", NAME, "--format", "json", cwd=folder)
    run_id = json.loads(listed.stdout)[0]["run_id"]
    done = in_process("--ledger", url, "run", run_id, "--skip-pilot", "--reason", "ported",
                      cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    yield folder, run_id, url, url.partition(":")[0].partition("+")[0]


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar if m.isfile()}


def _archive(folder: Path, url: str, target: Path) -> dict[str, bytes]:
    done = in_process("--ledger", url, "archive", NAME, "--output", str(target), cwd=folder)
    assert done.returncode == 0, done.stderr
    return _members(target)


def test_the_run_records_the_sibling_module_and_the_file_it_read(
        ported: tuple[Path, str, str, str], tmp_path: Path) -> None:
    folder, run_id, url, engine = ported
    members = _archive(folder, url, tmp_path / "a.tar.gz")
    environment = json.loads(members[f"runs/{run_id}/environment.json"])
    source = environment["task_source"]
    assert source["files"] == [f"ported_task_{engine}.py", f"original_script_{engine}.py"]
    script = (folder / f"original_script_{engine}.py").read_bytes()
    (read,) = environment["task_reads"]
    points = (folder / "data" / "points.csv").read_bytes()
    assert read == {"path": "data/points.csv", "bytes": len(points),
                    "sha256": hashlib.sha256(points).hexdigest()}
    (packed,) = json.loads(members["inputs.json"])["task_sources"]
    assert members[f"{packed['member_root']}/original_script_{engine}.py"] == script
    assert members["inputs/data/points.csv"] == points
    assert in_process("verify-archive", str(tmp_path / "a.tar.gz")).returncode == 0


def test_an_edit_to_the_imported_module_after_the_run_refuses_the_archive(
        ported: tuple[Path, str, str, str], tmp_path: Path) -> None:
    folder, run_id, url, engine = ported
    for edited in (folder / f"original_script_{engine}.py", folder / "data" / "points.csv"):
        kept = edited.read_bytes()
        try:
            edited.write_bytes(kept + b"\n")
            done = in_process("--ledger", url, "archive", NAME, "--output",
                              str(tmp_path / "a.tar.gz"), cwd=folder)
            assert done.returncode == 1 and not (tmp_path / "a.tar.gz").exists()
            assert f"run {run_id}" in done.stderr, done.stderr
            assert len(done.stderr.strip().splitlines()) == 1
        finally:
            edited.write_bytes(kept)


def _without(archive: Path, target: Path, dropped: str) -> None:
    """``archive`` rewritten without ``dropped`` (and its manifest line): every member left
    still hashes as listed, so only the run's own record can tell it is missing."""
    members = _members(archive)
    manifest = json.loads(members.pop("MANIFEST.json"))
    root = next(iter(manifest["members"])).split("/", 1)[0]
    del members[dropped]
    del manifest["members"][f"{root}/{dropped}"]
    inputs = json.loads(members["inputs.json"])
    if dropped.startswith("source/"):
        inputs["task_sources"][0]["files"].remove(dropped.rsplit("/", 1)[1])
    else:
        inputs["data"] = [e for e in inputs["data"] if e["value"] != "data/points.csv"]
    members["inputs.json"] = json.dumps(inputs).encode()
    manifest["members"][f"{root}/inputs.json"] = {
        "sha256": hashlib.sha256(members["inputs.json"]).hexdigest(),
        "bytes": len(members["inputs.json"])}
    members = {"MANIFEST.json": json.dumps(manifest).encode(), **members}
    with tarfile.open(target, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"{root}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_verify_archive_fails_when_a_recorded_module_or_file_is_absent(
        ported: tuple[Path, str, str, str], tmp_path: Path) -> None:
    folder, run_id, url, engine = ported
    members = _archive(folder, url, tmp_path / "a.tar.gz")
    (packed,) = json.loads(members["inputs.json"])["task_sources"]
    for dropped, said in ((f"{packed['member_root']}/original_script_{engine}.py",
                           f"original_script_{engine}.py"),
                          ("inputs/data/points.csv", "data/points.csv")):
        _without(tmp_path / "a.tar.gz", tmp_path / "b.tar.gz", dropped)
        done = in_process("verify-archive", str(tmp_path / "b.tar.gz"))
        assert done.returncode == 1, done.stderr
        assert f"run {run_id}" in done.stderr and said in done.stderr


@pytest.mark.slow
def test_reproduce_of_the_ported_project_is_bit_for_bit(
        ported: tuple[Path, str, str, str], tmp_path: Path) -> None:
    """The project folder is moved away: only the archive is left to read."""
    folder, run_id, url, engine = ported
    archive = tmp_path / "a.tar.gz"
    _archive(folder, url, archive)
    done = reproduced_elsewhere(folder, archive, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(done.stdout)["runs"]
    assert row["run_id"] == run_id and row["status"] == "completed"
    assert row["metrics"] == "identical" and row["weights"] == "identical"
    work = tmp_path / "again" / "work"
    assert (work / f"original_script_{engine}.py").is_file()
    assert (work / "data" / "points.csv").is_file()
    assert f"original_script_{engine}.py (sha256" in done.stderr


ARCHIVE_PEAK = """
import sys, tracemalloc
from click.testing import CliRunner
from campaign.cli import main
tracemalloc.start()
done = CliRunner().invoke(main, sys.argv[1:])
assert done.exit_code == 0, done.output
print(tracemalloc.get_traced_memory()[1] // 1024)
"""


@pytest.mark.slow
def test_the_archive_streams_a_large_input_and_holds_no_member_whole(tmp_path: Path) -> None:
    """A 96 MiB data file named by a task setting is packed in blocks: the peak of what the
    archiving process allocates is within 40 MiB of the same campaign's archive without the
    file (it read the file whole, and held every member whole, before)."""
    import subprocess
    import sys

    folder = tmp_path / NAME
    _project(folder, "stream")
    (folder / "blob.bin").write_bytes(b"\0" * (96 << 20))
    spec = folder / "spec.toml"
    spec.write_text(spec.read_text().replace('"optimizer.lr" = 1e-2\n\n[validation]',
                                             '"optimizer.lr" = 1e-2\n"task.blob" = "blob.bin"'
                                             '\n\n[validation]', 1))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    next(_trained(folder, url))

    def peak(*extra: str) -> int:
        done = subprocess.run([sys.executable, "-c", ARCHIVE_PEAK, "--ledger", url, "archive",
                               NAME, "--output", str(tmp_path / f"a{len(extra)}.tar.gz"),
                               *extra], cwd=folder, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return int(done.stdout.strip().splitlines()[-1])  # KiB, traced by tracemalloc

    (folder / "blob.bin").rename(tmp_path / "away.bin")
    without = peak("--data-limit", "0")
    (tmp_path / "away.bin").rename(folder / "blob.bin")
    packed = peak()
    assert "inputs/blob.bin" in _members(tmp_path / "a0.tar.gz")
    assert (packed - without) / 1024 < 40, f"{(packed - without) / 1024:.0f} MiB more"


@pytest.mark.slow
def test_a_read_file_a_setting_also_names_is_checked_against_the_run(tmp_path: Path) -> None:
    """The file the task read is also named by a task setting (packed from there): an edit
    after the run is still refused by the archive, naming the run, not left for
    verify-archive to find."""
    folder = tmp_path / NAME
    _project(folder, "covered")
    spec = folder / "spec.toml"
    spec.write_text(spec.read_text().replace('"optimizer.lr" = 1e-2\n\n[validation]',
                                             '"optimizer.lr" = 1e-2\n"task.points" = '
                                             '"data/points.csv"\n\n[validation]', 1))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    _, run_id, _, _ = next(_trained(folder, url))
    points = folder / "data" / "points.csv"
    points.write_text(points.read_text().replace("p0,", "q0,"))
    done = in_process("--ledger", url, "archive", NAME, "--output", str(tmp_path / "a.tar.gz"),
                      cwd=folder)
    assert done.returncode == 1 and f"run {run_id} read" in done.stderr, done.stderr
    assert not (tmp_path / "a.tar.gz").exists()


LATE_TASK = '''"""Reads each example from its own file when the loader asks, and imports a helper in
its loss: neither is seen by the time the run's environment is recorded."""
import numpy as np
import torch

import campaign


class Lazy:
    def __init__(self, names):
        self.names = names

    def __len__(self):
        return len(self.names)

    def __getitem__(self, index):
        with open(f"ex/{self.names[index]}.csv") as handle:
            a, b, y = (float(v) for v in handle.read().split(","))
        return {"id": self.names[index], "x": np.array([a, b], dtype=np.float32), "y": y}


class LateTask(campaign.Task):
    kind, target = "regression", "y"

    def model(self):
        return torch.nn.Linear(2, 1)

    def splits(self):
        names = [f"p{i}" for i in range(40)]
        return {"train": Lazy(names[:32]), "val": Lazy(names[32:])}

    def loss(self, model, batch):
        import late_helper

        predicted = self.outputs(model, batch).reshape(-1)
        return late_helper.squared(predicted, batch["y"].to(predicted.dtype)), len(predicted)


def build(config):
    return LateTask(config)
'''


@pytest.mark.slow
def test_what_a_task_reads_and_imports_after_its_start_is_archived(tmp_path: Path) -> None:
    """A lazy dataset opens each example's file in __getitem__ and the loss imports a
    helper: recorded when the run ends (an inputs_late event), packed, checked by
    verify-archive, and the project reproduced from the archive alone, bit for bit."""
    folder = tmp_path / NAME
    folder.mkdir()
    (folder / "late_task.py").write_text(LATE_TASK)
    (folder / "late_helper.py").write_text(
        "def squared(a, b):\n    return ((a - b) ** 2).sum()\n")
    (folder / "ex").mkdir()
    for i in range(40):
        a, b = (i % 8) / 4 - 1, (i // 8) / 4 - 1
        (folder / "ex" / f"p{i}.csv").write_text(f"{a},{b},{3 * a - 2 * b}")
    (folder / "spec.toml").write_text(SPEC.replace("ported_task_{engine}", "late_task"))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    _, run_id, _, _ = next(_trained(folder, url))
    members = _archive(folder, url, tmp_path / "a.tar.gz")
    late = json.loads(members[f"runs/{run_id}/environment.json"])["inputs_late"]
    assert late[0]["task_source"]["files"] == ["late_helper.py"]
    assert {r["path"] for r in late[0]["task_reads"]} == {f"ex/p{i}.csv" for i in range(40)}
    assert members["inputs/ex/p7.csv"] == (folder / "ex" / "p7.csv").read_bytes()
    assert in_process("verify-archive", str(tmp_path / "a.tar.gz")).returncode == 0
    done = reproduced_elsewhere(folder, tmp_path / "a.tar.gz", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(done.stdout)["runs"]
    assert row["metrics"] == "identical" and row["weights"] == "identical"
