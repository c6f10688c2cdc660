"""What a campaign leaves for the future, in one file, and the check that it is intact.

``campaign archive`` writes a gzipped tar with the frozen spec, every run's
resolved config and environment, the raw metrics (every segment) and the
events as Parquet, the task's source and the data its runs read (``inputs.json``,
:mod:`campaign.report.archive_inputs`), the validation predictions, output logs, tracebacks and
final artifacts (safetensors) of every run, the pilot's phase table, the notes, the HTML
report, a README on how to reload and replay, and ``MANIFEST.json``: the
SHA-256 and size of every other member. Artifacts are verified against the
ledger's hashes before they are packed (a file that changed since is
refused), and every file (artifacts, data) is streamed into the archive in
blocks and hashed again on the way: none is held whole in memory.
``campaign verify-archive`` streams every member (nothing is
extracted to disk, nothing held whole in memory) and checks it against the
manifest: a flipped byte, a missing, unlisted, duplicated or oversized member,
a link or a name that leaves the archive's folder is named.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from campaign.errors import ArchiveError
from campaign.ledger import Ledger
from campaign.report.archive_inputs import (
    DATA_LIMIT,
    InputsChanged,
    pack_inputs,
    with_late_inputs,
)
from campaign.report.atomic import check_target, write_atomically
from campaign.report.balance import balance_sheet
from campaign.report.inputs import campaign_inputs
from campaign.report.render import html
from campaign.stack.project import sha256_file
from campaign.stack.provenance import unread_problem

MANIFEST = "MANIFEST.json"
FOLDERS = {"final": "finals", "predictions": "predictions", "log": "logs",
           "traceback": "tracebacks"}
PACKED_KINDS = tuple(FOLDERS)


def write_archive(ledger: Ledger, campaign: str, output: Path,
                  data_limit: int = DATA_LIMIT) -> Path:
    """Pack ``campaign`` into ``output`` (a .tar.gz), atomically; at most ``data_limit`` bytes
    of the data its runs read are packed, the rest listed by hash (``inputs.json``)."""
    inputs = campaign_inputs(ledger, campaign)
    check_target(output, inputs)  # an unusable path is said before minutes of packing
    record = ledger.campaign(campaign)
    events = ledger.events(campaign)
    runs = with_late_inputs(ledger.runs(campaign), events)  # what tasks read after the start
    root = f"{campaign}-archive"
    members: dict[str, bytes | StreamedFile] = {}  # a file is streamed, never held whole

    def add(name: str, data: bytes) -> None:
        members[f"{root}/{name}"] = data

    def add_file(name: str, path: Path, sha256: str, size: int) -> None:
        members[f"{root}/{name}"] = StreamedFile(path, sha256, size)

    add("spec.json", record.spec.encode())  # the text the ledger hashed, byte for byte
    add("campaign.json", _json({"name": record.name, "question": record.question,
                                "task": record.task, "spec_sha256": record.spec_sha256,
                                "created_at": str(record.created_at)}))
    for run in runs.itertuples():
        add(f"runs/{run.run_id}/config.json", _json(run.config))
        add(f"runs/{run.run_id}/environment.json", _json(run.environment))
    add("runs.parquet", _parquet(runs.drop(columns=["config", "environment"])))
    add("metrics.parquet", _parquet(ledger.metrics(campaign, all_segments=True)))
    add("events.parquet", _parquet(events))
    add("segments.parquet", _parquet(ledger.segments(campaign)))
    sheet = balance_sheet(ledger, campaign)
    add("pilot-phases.parquet", _parquet(ledger.phases(campaign)))
    add("notes.json", _json(json.loads(sheet.notes.to_json(orient="records", date_format="iso"))))
    add("report.html", html(sheet).encode())
    artifacts = ledger.artifacts(campaign)
    packed = artifacts[artifacts["kind"].isin(PACKED_KINDS)]
    for artifact in packed.itertuples():
        if not Path(artifact.path).exists():
            raise ArchiveError(f"artifact {artifact.id} of run {artifact.run_id}: "
                               f"{artifact.path} is missing")
        unread = unread_problem(Path(artifact.path), int(artifact.bytes))
        if unread is not None:  # (a FIFO in its place hung the archive for ever)
            raise ArchiveError(f"artifact {artifact.id} of run {artifact.run_id}: "
                               f"{artifact.path} {unread}: refused unread")
        if sha256_file(Path(artifact.path)) != artifact.sha256:
            raise ArchiveError(f"artifact {artifact.id} of run {artifact.run_id}: {artifact.path} "
                               "no longer matches the ledger's SHA-256: refused")
        folder = FOLDERS[artifact.kind]
        add_file(f"{folder}/{artifact.run_id}/{Path(artifact.path).name}", Path(artifact.path),
                 artifact.sha256, int(artifact.bytes))
    try:
        inputs_document = pack_inputs(runs, list(packed["path"]), add, add_file, data_limit,
                                      " ".join(events["detail"].astype(str)))
    except InputsChanged as error:
        raise ArchiveError(str(error)) from None
    except OSError as error:
        raise ArchiveError(f"cannot read an input of the campaign's runs ({error})") from None
    add("inputs.json", _json(inputs_document))
    add("README.md", _readme(record.name, record.task).encode())
    manifest = {
        "campaign": record.name, "spec_sha256": record.spec_sha256,
        "members": {name: _listed(data) for name, data in sorted(members.items())},
    }
    members = {f"{root}/{MANIFEST}": _json(manifest), **members}  # first: checked before the rest

    def packed_into(temporary: Path) -> None:
        with tarfile.open(temporary, "w:gz") as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.mtime, info.mode = int(time.time()), 0o644
                if isinstance(data, StreamedFile):
                    info.size = data.size
                    with open(data.path, "rb") as handle:
                        checked = _Checked(handle)
                        try:
                            tar.addfile(info, checked)
                        except OSError:  # shorter than its header promised
                            checked.digest.update(b"truncated")
                    if checked.digest.hexdigest() != data.sha256:
                        raise ArchiveError(f"{data.path} changed while it was archived: "
                                           "refused (archive again)")
                else:
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))

    return write_atomically(output, packed_into, inputs)


@dataclass(frozen=True)
class StreamedFile:
    """A member packed from a file in blocks, with the hash and size it was checked to have."""

    path: Path
    sha256: str
    size: int


class _Checked(io.RawIOBase):
    """A file read through, hashed on the way (a file changed between its check and its
    packing is caught: its tar header already promised the size it had)."""

    def __init__(self, handle: Any) -> None:
        self.handle, self.digest = handle, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        block = self.handle.read(size)
        self.digest.update(block)
        return block


def _listed(data: bytes | StreamedFile) -> dict[str, Any]:
    if isinstance(data, StreamedFile):
        return {"sha256": data.sha256, "bytes": data.size}
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _json(document: Any) -> bytes:
    return json.dumps(document, indent=2, sort_keys=True, default=str).encode()


def _parquet(frame: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    plain = frame.copy()
    for column in plain.columns:  # decoded JSON documents go back to text
        if any(isinstance(v, dict | list) for v in plain[column]):  # (empty frames too)
            plain[column] = plain[column].map(lambda v: None if v is None else json.dumps(v))
    plain.to_parquet(buffer, index=False)
    return buffer.getvalue()


def _readme(name: str, task: str) -> str:
    return f"""# Archive of campaign `{name}`

Everything the campaign left, checked by `campaign verify-archive THIS.tar.gz`
(every member's SHA-256 is in `MANIFEST.json`).

- `spec.json`: the frozen spec; `campaign.json`: question, task, spec hash.
- `runs/RUN_ID/config.json` and `environment.json`: each run's resolved config
  and the software stack it ran on; `runs.parquet`: statuses and stop causes.
- `metrics.parquet`: every metric point of every segment (a resumed run's
  replayed steps included: take the highest `segment_id` per step to read as
  the ledger does); `events.parquet`, `segments.parquet`.
- `predictions/RUN_ID/*.parquet`: validation predictions.
- `finals/RUN_ID/final.safetensors` (`final-segment-N.safetensors` when a resumed
  segment wrote it): weights, config, environment and control
  outputs of every run that finished (no pickle anywhere).
- `pilot-phases.parquet`, `notes.json`, `report.html` (open in a browser).
- `inputs.json`: what the runs read. `source/DIGEST/`: the task's own source, as
  each run hashed it when it started; `inputs/`: the data files and folders the
  runs' `task.*` settings name, laid out as they were under the run's working
  directory (a file over the `--data-limit` is listed by SHA-256 and size only);
  `tokenizers/KEY/tokenizer.json`: a tokenizer the task trained.
- `runs/RUN_ID/environment.json` also holds every installed distribution and
  the git revision of the task's code with a dirty flag and its diff, the local
  modules and files its task used (`task_source`, `task_reads`) and, as
  `inputs_late`, those it imported or read after that was recorded (the run's
  `inputs_late` events).

Reload and replay a final artifact (outputs for the task's control inputs are
compared with those recorded at the end of training):

```bash
pip install campaign   # the version in environment.json
python -m campaign.loop.replay finals/RUN_ID/final.safetensors {task}
```

From Python: `safetensors.torch.load_file(path)` gives the tensors;
`safetensors.safe_open(path, "pt").metadata()` the JSON documents.
"""
