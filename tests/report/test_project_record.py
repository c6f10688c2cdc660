"""What a run records of its project (issue 42, item 1), seen from a fresh interpreter as a task
host is: a local module imported from another folder of ``sys.path`` joins the source as
``_roots/N/NAME``; a file opened for reading under the working folder is recorded with its
hash, but not one written, not one outside the folder, not code, and nothing read before the
task was loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = '''
import json, sys
sys.path.insert(0, sys.argv[1])
open("before.txt").read()  # read before any task was loaded: not the task's
from campaign.loop.taskref import load_factory
from campaign.stack import project, provenance
load_factory("task_module:build")
source = provenance.task_source("task_module:build")
print(json.dumps({"source": source,
                  "paths": [[n, str(p)] for n, p in provenance.source_paths(source)],
                  "reads": project.files_read(__import__("pathlib").Path.cwd(), [])}))
'''

TASK = '''
import helpers
open("data.txt").read()
open("written.txt", "w").write("x")
open(helpers.OUTSIDE).read()
def build(config):
    return None
'''


def test_a_module_from_another_folder_and_the_files_read_are_recorded(tmp_path: Path) -> None:
    work, library = tmp_path / "work", tmp_path / "library"
    work.mkdir()
    library.mkdir()
    (work / "task_module.py").write_text(TASK)
    (work / "data.txt").write_text("data")
    (work / "before.txt").write_text("before")
    (tmp_path / "outside.txt").write_text("outside")
    (library / "helpers.py").write_text(f"OUTSIDE = {str(tmp_path / 'outside.txt')!r}\n")
    done = subprocess.run([sys.executable, "-c", PROBE, str(library)], cwd=work,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    source = found["source"]
    assert source["files"] == ["task_module.py", "_roots/0/helpers.py"]
    assert source["roots"] == [str(library.resolve())]
    assert dict(found["paths"])["_roots/0/helpers.py"] == str(library.resolve() / "helpers.py")
    assert [read["path"] for read in found["reads"]] == ["data.txt"]
