"""`campaign demo` end to end (smaller budget), its archive, and the notebook against it."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import nbformat
import pytest
from click.testing import CliRunner, Result
from filelock import FileLock
from nbclient import NotebookClient

from campaign.cli import main
from campaign.gates.launch_gate import pilot_passed
from campaign.ledger import Ledger
from campaign.loop.replay import replay_artifact
from tests.support.launch_helpers import ROOT, invoke

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One demo for the whole run, whichever xdist worker asks first (the others wait for it
    under a file lock and read the same folder)."""
    shared = tmp_path_factory.getbasetemp().parent  # common to every worker of this run
    folder = shared / "demo"
    with FileLock(str(shared / "demo.lock")):
        if not (folder / "digits-lr-report.html").exists():
            # In this process (the command's own process is not what is tested; its runs
            # and checks are fresh children of this process's task host).
            done = invoke("sqlite:///unused-by-demo.db", "demo", "--dir", str(folder),
                          "--updates", "40", "--seeds", "2")
            assert done.returncode == 0, done.stderr[-3000:]
            for line in ("data gate passed", "pilot 1 (id 1) of gate class ", ": passed",
                         "report:"):
                assert line in done.stderr
    return folder


def test_demo_plans_pilots_launches_and_reports(demo: Path) -> None:
    report = demo / "digits-lr-report.html"
    assert report.exists() and report.stat().st_size > 10_000
    with Ledger.open(f"sqlite:///{demo / 'campaign.db'}", create=True) as ledger:
        runs = ledger.runs("digits-lr")
        assert len(runs) == 8  # 4 variants x 2 seeds
        aggressive = runs[runs["variant"] == "lr-3e0"]
        assert set(aggressive["status"]) == {"diverged"}  # the honest failure keeps its line
        assert set(runs[runs["variant"] != "lr-3e0"]["status"]) == {"completed"}
        assert pilot_passed(ledger, "digits-lr")
    html = report.read_text()
    assert "lr-3e0" in html and "diverged" in html and "loss_explosion" in html
    assert not (ROOT / "unused-by-demo.db").exists()  # the demo keeps to its own folder


def _cli(url: str, *args: str) -> Result:
    """The command line in this process (no process boundary is under test here)."""
    return CliRunner().invoke(main, ["--ledger", url, *args])


def test_archive_round_trip(demo: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{demo / 'campaign.db'}"
    archive = tmp_path / "digits-lr.tar.gz"
    packed = _cli(url, "archive", "digits-lr", "--output", str(archive))
    assert packed.exit_code == 0, packed.output
    checked = _cli(url, "verify-archive", str(archive))
    assert checked.exit_code == 0 and "every SHA-256 verified" in checked.stderr

    with tarfile.open(archive, "r:gz") as tar:
        names = tar.getnames()
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    for part in ("spec.json", "metrics.parquet", "report.html", "README.md", "MANIFEST.json",
                 "pilot-phases.parquet", "notes.json"):
        assert f"digits-lr-archive/{part}" in names
    finals = [n for n in names if n.endswith("final.safetensors")]
    assert len(finals) == 6  # every run that finished (the 2 diverged runs have none)
    assert sum("/predictions/" in n for n in names) >= 6

    # The final artifact inside reloads and replays the control inputs.
    final = tmp_path / "final.safetensors"
    final.write_bytes(members[finals[0]])
    identical, outputs, expected = replay_artifact(final, "campaign.tasks.digits:build")
    assert identical and outputs == expected and len(outputs) > 0

    # One flipped byte in the file: detected.
    damaged = tmp_path / "damaged.tar.gz"
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    refused = _cli(url, "verify-archive", str(damaged))
    assert refused.exit_code == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.count("\n") == 1
    assert "damaged" in refused.stderr or "does not match" in refused.stderr, refused.stderr

    # A member changed and the archive re-packed without a new manifest: named.
    tampered = tmp_path / "tampered.tar.gz"
    target = "digits-lr-archive/spec.json"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, content in members.items():
            content = content.replace(b"digits", b"DIGITS", 1) if name == target else content
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    tampered.write_bytes(gzip.compress(buffer.getvalue()))
    refused = _cli(url, "verify-archive", str(tampered))
    assert refused.exit_code == 1 and f"{target} does not match" in refused.stderr


def test_ledger_tour_notebook_runs_against_the_demo_ledger(demo: Path) -> None:
    notebook = nbformat.read(ROOT / "notebooks" / "ledger-tour.ipynb", as_version=4)
    os.environ["CAMPAIGN_DEMO_LEDGER"] = f"sqlite:///{demo / 'campaign.db'}"
    try:
        NotebookClient(notebook, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT)}}).execute()
    finally:
        del os.environ["CAMPAIGN_DEMO_LEDGER"]
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
                   for o in outputs)
    assert "lr-3e0 loss_explosion" in text and "image/png" in str(outputs)
