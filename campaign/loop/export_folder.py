"""``campaign export RUN_ID --to DIR``: a run's final artifact as a folder other tools load.

The final artifact's SHA-256 is checked against the ledger first; its model is rebuilt the
way a replay rebuilds it (an adapter's frozen base checked), in a child of the task host.
A task that knows another ecosystem writes its own folder (``export_pretrained``: the
causal-LM task writes what transformers and PEFT load); any other task gets the artifact's
weights as ``model.safetensors`` (the final artifact itself, byte for byte) and its resolved
config as ``config.json``. Every export carries the model card the command composed
(``README.md``) and a ``MANIFEST.json`` of its files with their SHA-256s.

The folder is written beside ``DIR`` under a temporary name and renamed into place once
whole: an export that fails leaves nothing half written, and nothing the ledger names is
ever written to.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from campaign.errors import LoopError
from campaign.ledger import Ledger
from campaign.loop.replay import load_final_model, verified_final
from campaign.loop.run_files import artifacts_environment


def export_run(url: str, run_id: str, target: str, merge: bool, card: str) -> dict[str, Any]:
    """Export ``run_id`` of the ledger at ``url`` into the new folder ``target``."""
    with Ledger.open(url) as ledger:
        record = ledger.run(run_id)
        row, path = verified_final(ledger, run_id)
        task_reference = ledger.campaign(record.campaign).task
    final = Path(target).absolute()
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        with artifacts_environment(path.absolute().parent.parent):  # a task's caches
            task, model, metadata = load_final_model(path, task_reference)
            model.eval()
            exporter = getattr(task, "export_pretrained", None)
            if callable(exporter):
                form = str(exporter(model, staging, final, merge))
            elif merge:
                raise LoopError("--merge: only a task with adapters merges (its task exports "
                                "whole models)")
            else:
                shutil.copyfile(path, staging / "model.safetensors")
                config = json.loads(metadata["config"])
                (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
                form = "safetensors + config.json"
        (staging / "README.md").write_text(card + _loading(form, final))
        files = _manifest(staging)
        (staging / "MANIFEST.json").write_text(json.dumps(
            {"run_id": run_id, "final_artifact_sha256": row["sha256"], "format": form,
             "files": files}, indent=2) + "\n")
        os.chmod(staging, 0o755)  # mkdtemp's 0700 is no folder to hand a colleague
        staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"run_id": run_id, "to": str(final), "format": form, "files": files,
            "final_artifact_sha256": row["sha256"]}


def _loading(form: str, folder: Path) -> str:
    """The card's last section: how to load this folder, in code."""
    if form.startswith("peft"):
        base = "f'{folder}/base'" if "base/" in form else "'THE BASE FOLDER'"
        code = ("from peft import PeftModel\nfrom transformers import AutoModelForCausalLM, "
                f"AutoTokenizer\n\nfolder = {str(folder)!r}\nbase = AutoModelForCausalLM."
                f"from_pretrained({base})\nmodel = PeftModel.from_pretrained(base, folder)\n"
                "tokenizer = AutoTokenizer.from_pretrained(folder)")
    elif form.startswith("transformers"):
        code = ("from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
                f"folder = {str(folder)!r}\nmodel = AutoModelForCausalLM.from_pretrained(folder)"
                "\ntokenizer = AutoTokenizer.from_pretrained(folder)")
    else:
        code = ("import json\nfrom safetensors.torch import load_file\n\n"
                f"state = load_file({str(folder / 'model.safetensors')!r})\n"
                f"config = json.load(open({str(folder / 'config.json')!r}))\n"
                "# model = your task's model(); model.load_state_dict(state)")
    return f"## Loading ({form})\n\n```python\n{code}\n```\n"


def _manifest(folder: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        found.append({"path": str(path.relative_to(folder)), "bytes": path.stat().st_size,
                      "sha256": digest})
    return found
