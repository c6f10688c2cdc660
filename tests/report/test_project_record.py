"""What a run records of its project (issue 42, item 1), seen from a fresh interpreter as a task
host is: a local module imported from another folder of ``sys.path`` joins the source as
``_roots/N/NAME`` (one inside the task's folder too: it is imported from there again), one
imported before any task was loaded (a ``PRELOAD``) counts when it lies in the project; a file
opened for reading under the working folder is recorded with its hash, but not one the task
wrote, not one outside the folder, not code, and nothing read before the task was loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = '''
import json, sys
sys.path[:0] = sys.argv[1:]
open("before.txt").read()  # read before any task was loaded: not the task's
import early_sibling  # a task's PRELOAD: imported by the host before the task
from campaign.loop.taskref import load_factory
from campaign.stack import project, provenance
load_factory("task_module:build")
source = provenance.task_source("task_module:build")
print(json.dumps({"source": source,
                  "paths": [[n, str(p)] for n, p in provenance.source_paths(source)],
                  "reads": project.files_read(__import__("pathlib").Path.cwd(), [])}))
'''

TASK = '''
import helpers, in_src
open("data.txt").read()
with open("written.txt", "w") as out:
    out.write("x")
open("written.txt").read()  # its own output read back: not an input
open(helpers.OUTSIDE).read()
def build(config):
    return None
'''


def test_modules_from_other_folders_and_the_files_read_are_recorded(tmp_path: Path) -> None:
    work, library = tmp_path / "work", tmp_path / "library"
    (work / "src").mkdir(parents=True)
    library.mkdir()
    (work / "task_module.py").write_text(TASK)
    (work / "early_sibling.py").write_text("VALUE = 1\n")
    (work / "src" / "in_src.py").write_text("VALUE = 2\n")
    (work / "data.txt").write_text("data")
    (work / "before.txt").write_text("before")
    (tmp_path / "outside.txt").write_text("outside")
    (library / "helpers.py").write_text(f"OUTSIDE = {str(tmp_path / 'outside.txt')!r}\n")
    done = subprocess.run([sys.executable, "-c", PROBE, str(library), str(work / "src"),
                           str(work)], cwd=work, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    source = found["source"]
    assert sorted(source["files"]) == ["_roots/0/helpers.py", "_roots/1/in_src.py",
                                       "early_sibling.py", "task_module.py"]
    assert sorted(source["roots"]) == sorted([str(library.resolve()),
                                              str((work / "src").resolve())])
    paths = dict(found["paths"])
    assert paths["_roots/0/helpers.py"] == str(Path(source["roots"][0]) / "helpers.py")
    assert [read["path"] for read in found["reads"]] == ["data.txt"]


def _records(environment: object, inputs: object) -> dict[str, bytes | None]:
    return {"inputs.json": json.dumps(inputs).encode(),
            "runs/r1/environment.json": json.dumps(environment).encode()}


def test_a_read_is_found_in_a_folder_a_setting_named_by_its_absolute_path() -> None:
    """``task.data_dir = "/proj/data"`` packs the folder under ``_absolute/...``; the run's
    read of ``data/points.csv`` (relative to its working folder ``/proj``) lies in it."""
    import pytest

    from campaign.errors import ArchiveError
    from campaign.report.archive_records import check_recorded_inputs

    digest = "ab" * 32
    read = {"path": "data/points.csv", "bytes": 3, "sha256": digest}
    inputs = {"task_sources": [], "data": [{
        "key": "task.data_dir", "value": "/proj/data", "working_directory": "/proj",
        "member_root": "_absolute/proj/data", "kind": "folder",
        "files": [{"file": "points.csv", "sha256": digest, "bytes": 3,
                   "member": "inputs/_absolute/proj/data/points.csv"}]}]}
    held = {"inputs/_absolute/proj/data/points.csv"}
    environment = {"working_directory": "/proj", "task_reads": [read]}
    check_recorded_inputs(Path("a.tar.gz"), _records(environment, inputs), held)
    with pytest.raises(ArchiveError, match=r"read data/points\.csv, which is not in the archive"):
        check_recorded_inputs(Path("a.tar.gz"), _records(environment, inputs), set())
    for hostile in ({"working_directory": "/proj", "task_reads": [1]},
                    {"task_source": "not a record"}):
        with pytest.raises(ArchiveError, match="not as campaign writes it"):
            check_recorded_inputs(Path("a.tar.gz"), _records(hostile, inputs), held)
    deep = {"inputs.json": b"[" * 100_000 + b"]" * 100_000, "runs/r1/environment.json": b"{}"}
    with pytest.raises(ArchiveError, match="not JSON"):
        check_recorded_inputs(Path("a.tar.gz"), deep, held)
