"""Replay the final artifact: reload the weights in a fresh process, rerun the control inputs.

The final artifact (safetensors) holds the weights and, as metadata, the
resolved config, the environment and the outputs the training process got
for the task's control inputs. Replaying in another process proves the
artifact alone reproduces them; the comparison is recorded as an event.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from campaign.errors import CampaignError
from campaign.host.calls import (
    FreshProcessFailed,
    Pending,
    answer,
    begin,
    run_module,
)
from campaign.host.processes import killed_from_outside, signal_name
from campaign.ledger import Ledger
from campaign.ledger.vocabulary import TERMINAL_STATUSES
from campaign.loop.checkpoint import (
    ALIASES_KEY,
    CheckpointError,
    file_sha256,
    stored_once,
    with_aliases,
)
from campaign.loop.data import to_device
from campaign.loop.full_artifact import write_gathered
from campaign.loop.loader import PreservedGenerators, seed_generators
from campaign.loop.model_state import base_record, load_saved_state, saved_state
from campaign.loop.replicas import Replica
from campaign.loop.run_files import artifacts_environment
from campaign.loop.task import build_task
from campaign.loop.taskref import load_factory
from campaign.stack.provenance import unread_problem

REPLAY_TIMEOUT_S = 600.0  # as `campaign replay` (campaign/cli/run.py)
RUN_LIFETIME_S = 365 * 24 * 3600.0  # an early replay child waits as long as its run trains
CONTROL_SEED = 0x5EED_C0_7201  # every process draws alike for the control inputs
BASE_KEY = "base_model"  # metadata: the frozen base an adapter-only artifact needs


def replay(ledger: Ledger, run_id: str, device: str = "cpu") -> dict[str, Any]:
    """Reload the run's final artifact (hash verified), replay control inputs on ``device`` (the
    training device when it is here: the outputs recorded at export were computed there; else
    the CPU), record the result."""
    record = ledger.run(run_id)
    row, path = verified_final(ledger, run_id)
    # the artifacts folder the run wrote into (ARTIFACTS/RUN_ID/final.safetensors): task code
    # that caches there (a trained tokenizer) finds its files
    with artifacts_environment(path.absolute().parent.parent):
        identical, outputs, expected = replay_artifact(path, ledger.campaign(record.campaign).task,
                                                       replay_device(device))
    detail = (
        f"final artifact {int(row['id'])} reloaded in process {os.getpid()} on "
        f"{replay_device(device)}: "
        f"{len(outputs)} control inputs, outputs {'identical' if identical else 'DIFFERENT'}"
    )
    if record.status in TERMINAL_STATUSES:  # an ended run takes no more rows: the campaign's
        ledger.add_event(record.campaign, "replay", f"run {run_id}: {detail}")
    else:  # the run's own check, before its end is recorded
        ledger.add_event(record.campaign, "replay", detail, run_id=run_id)
    return {"run_id": run_id, "identical": identical, "outputs": outputs, "expected": expected}


def verified_final(ledger: Ledger, run_id: str) -> tuple[Any, Path]:
    """The run's latest final artifact (its ledger row, its path), its file's SHA-256 checked
    against the ledger's; :class:`CheckpointError` names what is missing or changed."""
    record = ledger.run(run_id)
    frame = ledger.artifacts(record.campaign)
    finals = frame[(frame["run_id"] == run_id) & (frame["kind"] == "final")]
    if finals.empty:
        raise CheckpointError(f"run {run_id} has no final artifact")
    row = finals.sort_values("id").iloc[-1]
    path = Path(row["path"])
    if not path.exists():
        raise CheckpointError(f"run {run_id}: final artifact {path} is missing (moved or deleted)")
    unread = unread_problem(path, None if row["bytes"] != row["bytes"] else int(row["bytes"]))
    if unread is not None:
        raise CheckpointError(f"final artifact {path} {unread}: refused unread")
    if file_sha256(path) != row["sha256"]:
        raise CheckpointError(f"final artifact {path} does not match the ledger: refused")
    return row, path


def load_final_model(path: Path, task_reference: str) -> tuple[Any, torch.nn.Module, dict]:
    """(the task built from the artifact's own config, its model with the artifact's weights
    loaded, the artifact's metadata): an adapter's frozen base is rebuilt and checked."""
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    task = build_task(task_reference, json.loads(metadata["config"]))
    model = task.model()
    aliases = json.loads(metadata.get(ALIASES_KEY, "{}"))
    base = json.loads(metadata.get(BASE_KEY, "null"))  # an adapter's frozen base, checked
    load_saved_state(model, with_aliases(load_file(str(path)), aliases), task, base, str(path))
    return task, model, metadata


def replay_device(device: str) -> str:
    """``device`` when this process can use it, else the CPU."""
    parsed = torch.device(device)
    if parsed.type == "cuda" and not (torch.cuda.is_available()
                                      and (parsed.index or 0) < torch.cuda.device_count()):
        return "cpu"
    return device if parsed.type in ("cpu", "cuda") else "cpu"


def replay_artifact(path: Path, task_reference: str,
                    device: str = "cpu") -> tuple[bool, list[Any], list[Any]]:
    """Load weights and recorded control outputs from ``path``; replay on ``device``; compare."""
    task, model, metadata = load_final_model(path, task_reference)
    expected = json.loads(metadata["control_outputs"])
    model.to(device).eval()
    outputs = control_outputs(task, model, torch.device(device))
    return outputs == expected, outputs, expected


def control_outputs(task: Any, model: torch.nn.Module, device: torch.device) -> list[Any]:
    """The task's predictions for its control inputs, with every generator seeded alike
    (CONTROL_SEED) and restored after: a collate or a predict that draws (noise added at
    collate) draws the same in the process that trains and in the one that replays, whose
    generators otherwise hold whatever their process did before. The training's own random
    state is left as it was."""
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with PreservedGenerators(), torch.random.fork_rng(devices=cuda), torch.no_grad():
        seed_generators(CONTROL_SEED)
        if cuda:
            torch.cuda.manual_seed_all(CONTROL_SEED)
        batch = to_device(task.collate(list(task.control_inputs())), device)
        return json_values(task.predict(model, batch))


def write_final(
    path: Path,
    model: torch.nn.Module,
    task: Any,
    config_text: str,
    environment_text: str,
    device: torch.device,
    sharded: Replica | None = None,
    base: dict[str, Any] | None = None,
) -> list[Any]:
    """Write weights + config + environment + control outputs atomically; return the outputs.
    ``sharded``: this rank of a sharded run (every rank calls; rank 0 writes the full model
    gathered tensor by tensor, with ``base``, the frozen base the trainer recorded)."""
    from safetensors.torch import save_file

    model.eval()
    try:
        outputs = control_outputs(task, model, device)
    finally:
        model.train()
    metadata = {
        "config": config_text,
        "environment": environment_text,
        "control_outputs": json.dumps(outputs),
    }
    base = base_record(model, task) if sharded is None else base
    if base is not None:
        metadata[BASE_KEY] = json.dumps(base)
    if sharded is not None:
        write_gathered(path, model, task, metadata, sharded)
        return outputs
    # tied weights stored once; an adapter alone, its base named and hashed
    tensors, aliases = stored_once(saved_state(model, task))
    metadata[ALIASES_KEY] = json.dumps(aliases)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".partial")
    save_file(tensors, str(temporary), metadata=metadata)
    os.replace(temporary, path)
    return outputs


def json_values(value: Any) -> Any:
    """``value`` as a JSON round trip gives it back (tuples as lists, other objects as strings),
    so outputs computed here compare equal to those stored in the artifact's metadata."""
    return json.loads(json.dumps(value, default=str))


def replay_file_in_subprocess(path: Path, task_reference: str) -> dict[str, Any]:
    """``python -m campaign.loop.replay PATH TASK``: a fresh interpreter's verdict."""
    try:
        return dict(run_module(["-m", "campaign.loop.replay", str(path), task_reference],
                               task=task_reference))
    except FreshProcessFailed as error:
        return {"identical": False, "error": str(error)}


def replay_recorded(url: str, run_id: str, device: str = "cpu",
                    ride_out: bool = False) -> dict[str, Any]:
    """:func:`replay` on the ledger at ``url``: what ``campaign replay`` and a run's own replay
    check run in a fresh child of the task host (the URL travels on the host's channel).
    ``ride_out``: a run's own check rides out an outage as the run does; the command does not."""
    with Ledger.open(url, ride_out=ride_out) as ledger:
        return replay(ledger, run_id, device)


def replay_when_told(url: str, run_id: str, task_reference: str, go: str,
                     device: str = "cpu") -> dict[str, Any]:
    """The replay's fresh child, started as its run starts: it imports the task's module (the
    slow part: a user's module and what it imports, seconds) while the run trains, waits for
    ``go`` (the final artifact is written), then replays it (:func:`replay_recorded`). It is a
    child of the host, not of the run: it shares no memory with the process that trains."""
    with contextlib.suppress(Exception):  # an import error is the replay's to report
        load_factory(task_reference)
    while not Path(go).exists():
        time.sleep(0.02)
    return replay_recorded(url, run_id, device, ride_out=True)


@dataclass(frozen=True)
class ReplayProblem:
    """Why a run's replay check gave no verdict. ``interrupted``: its process was killed by a
    signal nobody of ours sent, twice (a scheduler's signal to the whole job, say): that says
    nothing of the artifact (flag ``replay_interrupted``). ``failed``: it ran and could not
    replay (flag ``replay_differs``)."""

    how: str
    why: str


class EarlyReplay:
    """A run's replay check, its fresh child started with the run (:func:`replay_when_told`)
    and told to replay once the final artifact is recorded; cancelled if the run ends
    otherwise. A replay child killed by a signal is retried once, in a new child."""

    def __init__(self, ledger: Ledger, run_id: str, task_reference: str,
                 device: str = "cpu", log: Path | None = None) -> None:
        url = ledger.engine.url
        self.url, self.run_id, self.task_reference, self.device = (
            url.render_as_string(hide_password=False), run_id, task_reference, device)
        self.log = log  # where the replay's prints go: the run's log, not a terminal
        self.why_not: str | None = None
        self.pending: Pending | None = None
        if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
            self.why_not = "an in-memory ledger is not visible to another process"
            return
        self.folder = tempfile.TemporaryDirectory(prefix="campaign-replay-")
        self.go = Path(self.folder.name) / "go"
        self.pending = begin(replay_when_told, self.url, run_id, task_reference, str(self.go),
                             device, task=task_reference, what=f"replaying run {run_id}",
                             timeout_s=RUN_LIFETIME_S, log=log)

    def result(self) -> ReplayProblem | None:
        """Replay now. None when it answered (identical or not: the replay records its own
        ``replay`` event, the evidence); otherwise why it could not replay."""
        if self.pending is None:
            return ReplayProblem("failed", str(self.why_not))
        self.go.touch()
        self.pending.deadline = time.monotonic() + REPLAY_TIMEOUT_S
        self.pending.limit = REPLAY_TIMEOUT_S
        try:
            return self._answer(self.pending, retried=False)
        finally:
            self.cancel()

    def _answer(self, pending: Pending, *, retried: bool) -> ReplayProblem | None:
        try:
            verdict = pending.result()
        except CampaignError as error:  # any project error of the child, a ledger's included
            killed = _killed_by(pending)
            if killed is None:
                return ReplayProblem("failed", str(error))
            if retried:
                return ReplayProblem("interrupted", f"its process was killed by {killed} twice, "
                                     "a signal nobody of ours sent; `campaign replay "
                                     f"{self.run_id}` checks it again")
            try:
                again = begin(replay_recorded, self.url, self.run_id, self.device, True,
                              task=self.task_reference, what=f"replaying run {self.run_id}",
                              timeout_s=REPLAY_TIMEOUT_S, log=self.log)
            except CampaignError as error:
                return ReplayProblem("interrupted", f"its process was killed by {killed}; "
                                     f"the retry could not start: {error}")
            try:
                return self._answer(again, retried=True)
            finally:
                again.cancel()
        if "identical" in verdict:
            return None
        return ReplayProblem("failed", "the fresh process answered no verdict")

    def cancel(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
            self.pending = None
            self.folder.cleanup()


def _killed_by(pending: Pending) -> str | None:
    """The signal that ended a replay child from outside (not its own crash, not our limit)."""
    code, child = pending.child.exitcode, pending.child
    if pending.timed_out or not killed_from_outside(code, child.host_gone):
        return None
    return "its task host's end" if child.host_gone else signal_name(-(code or 0))


if __name__ == "__main__":
    identical_, outputs_, expected_ = replay_artifact(Path(sys.argv[1]), sys.argv[2])
    verdict = {"identical": identical_, "outputs": outputs_, "expected": expected_,
               "pid": os.getpid()}
    if not answer(verdict):  # through the answer file: a task's prints cannot corrupt it
        print(json.dumps(verdict))
