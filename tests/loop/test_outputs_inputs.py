"""Outputs never overwrite inputs (issue 26, item 9): report, archive, tensorboard and init
refuse the ledger file (and its WAL), an artifact the ledger names, a spec of the campaign
and a symbolic link, in one line with exit 2, and every input stays byte for byte."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from campaign.cli import main
from campaign.ledger import Ledger
from campaign.loop.train import execute
from tests.support.loop_helpers import plan_loop


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One real completed run (12 updates of digits) with its final artifact, and a spec."""
    root = tmp_path_factory.mktemp("inputs")
    url = f"sqlite:///{root / 'campaign.db'}"
    with Ledger.open(url, create=True) as ledger:
        run_id = plan_loop(ledger)[0]
        execute(ledger, run_id, artifacts=root / "artifacts", replay_in_subprocess=False)
        finals = ledger.artifacts("loop").query("kind == 'final'")
    spec = root / "spec.toml"
    spec.write_text('[campaign]\nname = "loop"\nquestion = "does the loop work?"\n')
    return {"root": root, "url": url, "final": Path(finals["path"].iloc[0]), "spec": spec}


def _invoke(trained: dict, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["--ledger", trained["url"], *args])
    return result.exit_code, result.stderr


def _inputs(trained: dict) -> dict[Path, str]:
    root = trained["root"]
    paths = [root / "campaign.db", trained["final"], trained["spec"]]
    return {p: _digest(p) for p in paths}


@pytest.mark.parametrize("target", ["ledger", "wal", "final", "spec", "ledger-dotted"])
@pytest.mark.parametrize("command", ["report", "report-json", "archive"])
def test_an_output_onto_an_input_is_refused(trained: dict, target: str, command: str) -> None:
    root = trained["root"]
    path = {"ledger": root / "campaign.db", "wal": root / "campaign.db-wal",
            "final": trained["final"], "spec": trained["spec"],
            "ledger-dotted": root / "artifacts" / ".." / "campaign.db"}[target]
    before = _inputs(trained)
    args = {"report": ["report", "loop", "--output", str(path)],
            "report-json": ["report", "loop", "--format", "json", "--output", str(path)],
            "archive": ["archive", "loop", "--output", str(path)]}[command]
    code, stderr = _invoke(trained, *args)
    assert code == 2, stderr
    assert "an output never replaces an input" in stderr and len(stderr.splitlines()) == 1
    expected = {"ledger": "the campaign's ledger", "wal": "the campaign's ledger",
                "ledger-dotted": "the campaign's ledger", "final": "(final) of run",
                "spec": "is a spec of campaign 'loop'"}[target]
    assert expected in stderr
    assert _inputs(trained) == before
    assert not list(path.parent.glob(f".{path.name}.*.partial"))


def test_a_symlink_target_and_a_planted_partial_are_not_written_through(
    trained: dict, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    link = tmp_path / "report.html"
    link.symlink_to(victim)
    code, stderr = _invoke(trained, "report", "loop", "--output", str(link))
    assert code == 2 and "is a symbolic link" in stderr
    planted = tmp_path / ".real.html.partial"  # the old fixed temporary name
    planted.symlink_to(victim)
    code, stderr = _invoke(trained, "report", "loop", "--output", str(tmp_path / "real.html"))
    assert code == 0, stderr
    assert victim.read_text() == "keep me" and (tmp_path / "real.html").stat().st_size > 1000
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "real.html").stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's


def test_tensorboard_never_replaces_an_input(trained: dict) -> None:
    """A ledger named like the export's state file, in the logdir: refused, left alone."""
    root = trained["root"]
    code, stderr = _invoke(trained, "tensorboard", "loop", "--logdir", str(root / "tb"))
    assert code == 0, stderr
    state = ".campaign-tensorboard.json"  # the export's state file
    other = root / "other"
    other.mkdir(exist_ok=True)
    ledger = other / state
    ledger.write_bytes((root / "campaign.db").read_bytes())
    url = f"sqlite:///{ledger}"
    result = CliRunner().invoke(main, ["--ledger", url, "tensorboard", "loop", "--logdir",
                                       str(other)])
    assert result.exit_code == 2 and "the campaign's ledger" in result.stderr, result.stderr
    assert ledger.read_bytes() == (root / "campaign.db").read_bytes()


def test_init_writes_through_no_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim.py"
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "study_task.py").symlink_to(victim)  # dangling: exists() says False
    result = CliRunner().invoke(main, ["init", str(folder)])
    assert result.exit_code == 2 and "already exist" in result.stderr, result.stderr
    assert not victim.exists() and not (folder / "spec.toml").exists()
