"""The ledger's curves as TensorBoard event files, exact, and only what is new on each export.

One folder per run, ``LOGDIR/VARIANT/seed-S-RUNID`` (the variant made safe
for a file name), holding:

- every metric key as a scalar at its update step, a float32 tensor as
  TensorBoard's own ``scalar`` summaries write it: its default loader (the
  Rust data server of ``tensorboard --logdir DIR``) shows float32 scalars
  and drops float64 ones without a word, so every value shows rounded to
  float32, as TensorBoard shows any value; the exact values are the
  ledger's (``campaign curve``, ``Ledger.metrics``);
- the run's resolved config as hyperparameters (the HParams plugin's session
  start, one dotted key per hyperparameter) and, once the run ended, its
  session end (success for completed/stopped, failure otherwise);
- its status and stop (cause, step, phase, detail) as text, written again
  whenever they change.

What was written is kept in ``LOGDIR/.campaign-tensorboard.json`` (per run:
the last step of each key, the segment, the status written), replaced
atomically after the event files are flushed (every 2 s and at the end, an
interrupted export included), so a second export writes only new points. A
resume that re-ran steps after its checkpoint is written again from there,
as its newest segment logs them: TensorBoard's reader drops the earlier
points of those steps when it meets an older step in the same file series,
as for any restarted job.

Built on TensorBoard's protos, its record writer and its plugin metadata;
TensorFlow is not needed. Nothing is read but the ledger.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from campaign.errors import ExportError
from campaign.ledger import LedgerReader
from campaign.ledger.vocabulary import TERMINAL_STATUSES
from campaign.report.atomic import write_atomically
from campaign.report.inputs import CampaignInputs, campaign_inputs

STATE_FILE = ".campaign-tensorboard.json"
SUCCEEDED = ("completed", "stopped")


@dataclass(frozen=True)
class Exported:
    runs: int
    points: int
    finished: bool  # every run of the campaign is terminal and written


def export(reader: LedgerReader, campaign: str, logdir: Path) -> Exported:
    """Write what is new in ``campaign`` since the last export into ``logdir``."""
    protos = _protos()
    inputs = campaign_inputs(reader, campaign)  # the state file never replaces one
    refusal = inputs.refusal(logdir / STATE_FILE)
    if refusal is not None:
        raise ExportError(f"cannot write under --logdir {logdir}: {refusal}")
    state = _load_state(logdir, campaign)
    _, rows = reader.live_runs(campaign)
    started = [row for row in rows if row["started_at"] is not None]
    segments = reader.latest_segments([row["id"] for row in started])
    written_points, touched, saved = 0, 0, time.monotonic()
    try:
        for row in started:
            run_state = state["runs"].setdefault(row["id"], {
                "steps": {}, "segment": None, "status": None, "hparams": False, "ended": False,
            })
            if run_state["ended"]:
                continue
            exported = bool(run_state["hparams"])  # by an earlier export
            records = _run_records(reader, row, run_state, segments.get(row["id"]), protos)
            if records:
                # A run keeps the folder of its first export: a relaunch an export before
                # issue 26 filed under seed-S stays there, its curve in one piece.
                legacy = _run_folder({**row, "relaunch_of": None})
                folder = logdir / run_state.setdefault(
                    "folder", legacy if exported else _run_folder(row))
                folder.mkdir(parents=True, exist_ok=True)
                _append(folder, run_state, records, protos)
                touched += 1
                written_points += sum(1 for kind, *_ in records if kind == "point")
            if time.monotonic() - saved > 2:  # an interrupted export keeps what it wrote
                _save_state(logdir, state, inputs)
                saved = time.monotonic()
    except OSError as error:
        raise ExportError(f"cannot write under --logdir {logdir}: {error.strerror or error}"
                          ) from None
    finally:
        if logdir.is_dir():
            try:
                _save_state(logdir, state, inputs)
            except OSError as error:
                raise ExportError(f"cannot write {logdir / STATE_FILE}: "
                                  f"{error.strerror or error}") from None
    finished = all(row["status"] in TERMINAL_STATUSES for row in rows)
    return Exported(touched, written_points, finished)


def _save_state(logdir: Path, state: dict[str, Any], inputs: CampaignInputs) -> None:
    state["runs"] = {k: v for k, v in state["runs"].items() if v["steps"] or v["status"]}
    write_atomically(logdir / STATE_FILE,
                     lambda path: path.write_text(json.dumps(state, indent=1), encoding="utf-8"),
                     inputs)


def follow_export(
    reader: LedgerReader, campaign: str, logdir: Path, every_s: float,
    say: Callable[[str], None] | None = None,
) -> None:
    """Export every ``every_s`` seconds until every run is terminal (or Ctrl-C)."""
    import sys

    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    say(f"campaign tensorboard: following {campaign!r} into {logdir} (Ctrl-C stops)")
    try:
        while True:
            done = export(reader, campaign, logdir)
            if done.points or done.runs:
                say(f"{done.points} new points of {done.runs} runs")
            if done.finished:
                say("every run has ended: export complete")
                return
            time.sleep(every_s)
    except KeyboardInterrupt:
        say("stopped")


def _run_records(
    reader: LedgerReader, row: dict[str, Any], run_state: dict[str, Any],
    segment: tuple[int, int] | None, protos: Any,
) -> list[tuple[Any, ...]]:
    """The records to append for one run: hparams once, new points, status when changed."""
    records: list[tuple[Any, ...]] = []
    if not run_state["hparams"]:
        run = reader.run(row["id"])
        lineage = {"relaunch_of": run.relaunch_of or "", "relaunch_reason": run.relaunch_reason
                   or ""} if run.relaunch_of else {}
        records.append(("hparams", {**run.config_document, **lineage}))
        run_state["hparams"] = True
    steps: dict[str, int] = run_state["steps"]
    if segment is not None and run_state["segment"] not in (None, segment[0]):
        for key in steps:  # a resume re-ran the steps after its checkpoint
            steps[key] = min(steps[key], segment[1])
    if segment is not None:
        run_state["segment"] = segment[0]
    # From the oldest key's last step itself: a key first logged at that update (or committed
    # in a later batch than its sibling) is still found; what was written is skipped by key.
    start = min(steps.values(), default=0)
    latest: dict[tuple[str, int], float | None] = {}
    open_run = row["status"] not in TERMINAL_STATUSES
    for _run, key, step, in_segment, value in reader.points_from({row["id"]: start}):
        if open_run and segment is not None and step > segment[1] and in_segment != segment[0]:
            continue  # a resumed run: what its newest segment re-runs is written when it does
        if step > steps.get(key, -1):
            latest[(key, step)] = value  # rows are ordered by segment: the newest wins
    for (key, step), value in sorted(latest.items(), key=lambda item: (item[0][1], item[0][0])):
        records.append(("point", key, step, value))
        steps[key] = max(steps.get(key, -1), step)
    status = _status_text(row)
    if status != run_state["status"]:
        records.append(("status", status, max(steps.values(), default=0)))
        run_state["status"] = status
    if row["status"] in TERMINAL_STATUSES:
        records.append(("end", row["status"]))
        run_state["ended"] = True
    return records


def _append(folder: Path, run_state: dict[str, Any], records: list[tuple[Any, ...]],
            protos: Any) -> None:
    """Append ``records`` to this process's event file in ``folder`` (one file per exporting
    process and run, opened for each pass: a thousand runs never hold a thousand files)."""
    name = run_state.get("file")
    if not name or not (folder / name).exists() or run_state.get("pid") != os.getpid():
        name = (f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}."
                f"{os.getpid()}.campaign")
        run_state["file"], run_state["pid"] = name, os.getpid()
        fresh = True
    else:
        fresh = False
    with open(folder / name, "ab") as handle:
        writer = protos.RecordWriter(handle)
        if fresh:
            writer.write(protos.Event(wall_time=time.time(),
                                      file_version="brain.Event:2").SerializeToString())
        for record in records:
            writer.write(_event(record, protos).SerializeToString())
        handle.flush()
        os.fsync(handle.fileno())


def _event(record: tuple[Any, ...], protos: Any) -> Any:
    kind = record[0]
    now = time.time()
    if kind == "point":
        _, key, step, value = record
        tensor = protos.make_tensor_proto(_shown(value), dtype="float32")
        metadata = protos.scalar_metadata(display_name=key, description="")
        summary = protos.Summary(value=[protos.Summary.Value(tag=key, tensor=tensor,
                                                             metadata=metadata)])
        return protos.Event(wall_time=now, step=int(step), summary=summary)
    if kind == "status":
        _, text, step = record
        tensor = protos.make_tensor_proto(text.encode("utf-8"))
        metadata = protos.text_metadata(display_name="run", description="status and stop")
        summary = protos.Summary(value=[protos.Summary.Value(tag="run/status", tensor=tensor,
                                                             metadata=metadata)])
        return protos.Event(wall_time=now, step=int(step), summary=summary)
    if kind == "hparams":
        info = protos.SessionStartInfo(start_time_secs=now)
        for name, value in _flat_config(record[1]).items():
            if isinstance(value, bool):
                info.hparams[name].bool_value = value
            elif isinstance(value, int | float):
                info.hparams[name].number_value = float(value)
            else:
                info.hparams[name].string_value = value
        data = protos.HParamsPluginData(session_start_info=info, version=0)
        return _hparams_event(protos.SESSION_START_INFO_TAG, data, now, protos)
    status = protos.STATUS_SUCCESS if record[1] in SUCCEEDED else protos.STATUS_FAILURE
    data = protos.HParamsPluginData(session_end_info=protos.SessionEndInfo(
        status=status, end_time_secs=now), version=0)
    return _hparams_event(protos.SESSION_END_INFO_TAG, data, now, protos)


def _hparams_event(tag: str, data: Any, now: float, protos: Any) -> Any:
    summary = protos.Summary(value=[protos.Summary.Value(
        tag=tag, metadata=protos.hparams_metadata(data), tensor=protos.NULL_TENSOR)])
    return protos.Event(wall_time=now, summary=summary)


def _flat_config(config: Any) -> dict[str, Any]:
    from campaign.plan.config_keys import flatten

    flat = {}
    for key, value in flatten(config).items():
        if value is None or isinstance(value, list | dict):
            value = json.dumps(value)
        flat[key] = value
    return flat


def _status_text(row: dict[str, Any]) -> str:
    text = f"status: {row['status']}"
    if row["stop_cause"]:
        text += f"; stop: {row['stop_cause']} at update {row['stop_step']}"
    return text


def _run_folder(row: dict[str, Any]) -> str:
    """``VARIANT/seed-S-RUNID`` for an original run; a relaunch is kept apart, with its
    lineage in the name (``VARIANT/relaunch-seed-S-RUNID-of-ORIGINAL``): it is never another
    run of its variant's seed."""
    safe = re.sub(r"[^A-Za-z0-9._=+-]", "_", str(row["variant"])).lstrip(".") or "_"
    if row.get("relaunch_of"):
        return f"{safe[:100]}/relaunch-seed-{int(row['seed'])}-{row['id']}-of-{row['relaunch_of']}"
    return f"{safe[:100]}/seed-{int(row['seed'])}-{row['id']}"


def _shown(value: float | None) -> float:
    """The value as float32 shows it (one past float32's range is an infinity of its sign);
    a missing value is NaN."""
    import numpy as np

    with np.errstate(over="ignore"):
        return float(np.float32(float("nan") if value is None else value))


# What an export writes its scalars as, kept in the state: a folder holding an earlier
# export's float64 scalars (which TensorBoard's default loader does not show) is not added to.
SCALARS = "float32"


def _load_state(logdir: Path, campaign: str) -> dict[str, Any]:
    path = logdir / STATE_FILE
    if logdir.exists() and not logdir.is_dir():
        raise ExportError(f"--logdir {logdir} is a file, not a folder")
    if not path.exists():
        return {"campaign": campaign, "scalars": SCALARS, "runs": {}}
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ExportError(f"{path}: unreadable export state ({error}); remove the folder to "
                          "export everything again") from None
    if not isinstance(state, dict) or not isinstance(state.get("runs"), dict) or not all(
        isinstance(v, dict) and set(v) >= _STATE_KEYS and isinstance(v["steps"], dict)
        for v in state["runs"].values()
    ):
        raise ExportError(f"{path}: not an export state this version wrote; remove the folder "
                          "to export everything again")
    if state.get("campaign") != campaign:
        raise ExportError(f"--logdir {logdir} holds campaign {state.get('campaign')!r}, not "
                          f"{campaign!r}: give each campaign its own folder")
    if state.get("scalars", "float64") != SCALARS and state["runs"]:
        raise ExportError(f"--logdir {logdir} holds an earlier export's float64 scalars, "
                          "which TensorBoard's default loader does not show: export into a "
                          "new folder")
    state["scalars"] = SCALARS
    return state


_STATE_KEYS = frozenset({"steps", "segment", "status", "hparams", "ended"})


def _protos() -> Any:
    """TensorBoard's pieces, imported at first use (the ``campaign[tensorboard]`` extra)."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
        from tensorboard.plugins.hparams import metadata as hparams_meta
        from tensorboard.plugins.scalar import metadata as scalar_meta
        from tensorboard.plugins.text import metadata as text_meta
        from tensorboard.summary.writer.record_writer import RecordWriter
        from tensorboard.util.tensor_util import make_tensor_proto
    except ImportError:
        raise ExportError("TensorBoard is not installed: pip install 'campaign[tensorboard]'"
                          ) from None

    class Protos:
        Event = event_pb2.Event
        Summary = summary_pb2.Summary
        SessionStartInfo = plugin_data_pb2.SessionStartInfo
        SessionEndInfo = plugin_data_pb2.SessionEndInfo
        HParamsPluginData = plugin_data_pb2.HParamsPluginData
        STATUS_SUCCESS = api_pb2.Status.STATUS_SUCCESS
        STATUS_FAILURE = api_pb2.Status.STATUS_FAILURE
        SESSION_START_INFO_TAG = hparams_meta.SESSION_START_INFO_TAG
        SESSION_END_INFO_TAG = hparams_meta.SESSION_END_INFO_TAG
        NULL_TENSOR = hparams_meta.NULL_TENSOR

    protos = Protos()
    protos.RecordWriter = RecordWriter  # type: ignore[attr-defined]
    protos.make_tensor_proto = make_tensor_proto  # type: ignore[attr-defined]
    protos.scalar_metadata = scalar_meta.create_summary_metadata  # type: ignore[attr-defined]
    protos.text_metadata = text_meta.create_summary_metadata  # type: ignore[attr-defined]
    protos.hparams_metadata = hparams_meta.create_summary_metadata  # type: ignore[attr-defined]
    return protos
