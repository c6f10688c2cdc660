"""``campaign export`` of any task (digits): the final artifact as model.safetensors (byte for
byte), the resolved config, a model card with the run's value and hashes, a manifest; a run
without a final artifact and a final artifact changed since the ledger recorded it are
refused in one line, nothing created. (The causal-LM folders: tests/tasks/test_causal_lm.py.)"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from click.testing import CliRunner
from safetensors.torch import load_file

from campaign.cli import main
from campaign.ledger import Ledger
from campaign.loop.train import execute
from campaign.report.balance import balance_sheet
from tests.support.loop_helpers import plan_loop


def test_any_task_exports_its_artifact_config_and_card(sqlite_url: str, tmp_path: Path) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        run_id, waiting = plan_loop(ledger, seeds=[0, 1])
        execute(ledger, run_id, artifacts=tmp_path / "a", replay_in_subprocess=False)
        final = Path(ledger.artifacts("loop").query("kind == 'final'")["path"].iloc[0])
        config = ledger.run(run_id).config_document
        value = balance_sheet(ledger, "loop").runs.set_index("run_id").loc[run_id, "final_metric"]
    folder = tmp_path / "out"
    done = CliRunner().invoke(main, ["--ledger", sqlite_url, "export", run_id, "--to",
                                     str(folder), "--format", "json"])
    assert done.exit_code == 0, done.output
    assert sorted(p.name for p in folder.iterdir()) == ["MANIFEST.json", "README.md",
                                                        "config.json", "model.safetensors"]
    assert (folder / "model.safetensors").read_bytes() == final.read_bytes()
    assert load_file(str(folder / "model.safetensors")).keys() == load_file(str(final)).keys()
    assert json.loads((folder / "config.json").read_text()) == config
    card = (folder / "README.md").read_text()
    sha = hashlib.sha256(final.read_bytes()).hexdigest()
    assert f"final artifact SHA-256: `{sha}`" in card and "does the loop work?" in card
    assert f"val/accuracy (max): {value:.6g} (final, at update 12)" in card
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    listed = {f["path"]: f["sha256"] for f in manifest["files"]}
    assert listed["model.safetensors"] == sha == manifest["final_artifact_sha256"]
    assert json.loads(done.stdout)["format"] == "safetensors + config.json"

    planned = CliRunner().invoke(main, ["--ledger", sqlite_url, "export", waiting, "--to",
                                        str(tmp_path / "planned")])
    assert planned.exit_code == 2 and "is planned: only a completed or stopped run" in (
        planned.stderr)
    final.write_bytes(final.read_bytes()[:-1] + b" ")  # changed since the ledger recorded it
    tampered = CliRunner().invoke(main, ["--ledger", sqlite_url, "export", run_id, "--to",
                                         str(tmp_path / "tampered")])
    assert tampered.exit_code == 1, tampered.output
    assert tampered.stderr.count("\n") == 1 and "does not match the ledger" in tampered.stderr
    assert not (tmp_path / "tampered").exists() and not list(tmp_path.glob(".tampered.*"))
