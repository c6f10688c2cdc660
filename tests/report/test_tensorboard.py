"""`campaign tensorboard` on SQLite and PostgreSQL: read back with TensorBoard's own reader (the
data provider its scalar dashboard uses) and from a real `tensorboard --logdir` server with its
default loader, the event files equal the ledger's metrics as float32 shows them, bit for
bit; a second export writes only new points; --follow picks up points written after it
started and ends when every run has ended; bad folders are one line each."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from click.testing import CliRunner
from tensorboard import context
from tensorboard.backend.event_processing import data_provider, event_accumulator
from tensorboard.backend.event_processing import plugin_event_multiplexer as multiplexer
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.util import tensor_util

from campaign.cli import main
from campaign.ledger import Ledger, StopRecord
from tests.support.helpers import plan_campaign
from tests.support.launch_helpers import start, wait_for
from tests.support.outages import free_port

NAME = "exported"


def _fill(ledger: Ledger) -> dict[str, str]:
    """Four runs: one completed, one diverged (a NaN), one resumed after re-running steps,
    one still running; values with every bit of a float64 significant."""
    record = plan_campaign(ledger, NAME, seeds=2, variants={"lr-1e-4": 1e-4, "lr/odd name": 2e-4})
    ids = dict(zip(("done", "nan", "resumed", "running"), record.run_ids, strict=True))
    for label, run_id in ids.items():
        claim = ledger.claim_next(NAME, "test")
        assert claim is not None and claim.run_id == run_id
        with ledger.metric_writer(run_id, claim.segment_id) as metrics:
            for step in range(1, 11):
                metrics.log("train/loss", step, math.pi / step + 1e-13 * step, 16 * step)
                if step % 5 == 0:
                    metrics.log("val/accuracy", step, 1 / 3 + step * 1e-15, 16 * step)
            if label == "nan":
                metrics.log("train/loss", 11, float("nan"), 176)
        if label == "done":
            ledger.finish(run_id, "completed", StopRecord("budget_reached", 10, "update"))
        elif label == "nan":
            ledger.finish(run_id, "diverged", StopRecord("non_finite_loss", 11, "update"))
        elif label == "resumed":
            ledger.finish(run_id, "interrupted", StopRecord("interrupted", 10, "update"))
            again = ledger.start(run_id, "test-2", start_step=5)
            with ledger.metric_writer(run_id, again.segment_id) as metrics:
                for step in range(6, 13):  # re-runs 6-10 with other values, then goes on
                    metrics.log("train/loss", step, 10.0 + step / 7, 16 * step)
                    if step % 5 == 0:
                        metrics.log("val/accuracy", step, 0.5 + step / 1e3, 16 * step)
            ledger.finish(run_id, "completed", StopRecord("budget_reached", 12, "update"))
    return ids


def _read_back(logdir: Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """run folder -> key -> [(step, value)] through TensorBoard's scalar data provider."""
    mux = multiplexer.EventMultiplexer(size_guidance={event_accumulator.TENSORS: 0})
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, str(logdir))
    scalars = provider.read_scalars(context.RequestContext(), experiment_id="",
                                    plugin_name="scalars", downsample=10**9)
    return {run: {key: [(d.step, d.value) for d in data] for key, data in tags.items()}
            for run, tags in scalars.items()}


def _ledger_points(ledger: Ledger) -> dict[str, dict[str, list[tuple[int, float]]]]:
    frame = ledger.metrics(NAME)
    runs = ledger.runs(NAME).set_index("run_id")
    expected: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for (run_id, key), part in frame.groupby(["run_id", "key"]):
        variant = runs.loc[run_id, "variant"].replace("/", "_").replace(" ", "_")
        folder = f"{variant}/seed-{runs.loc[run_id, 'seed']}-{run_id}"
        expected.setdefault(folder, {})[key] = [
            (int(s), _f32(float("nan") if v is None else v))
            for s, v in zip(part["step"], part["value"], strict=True)]
    return expected


def _f32(value: float) -> float:
    """``value`` as TensorBoard shows it (float32)."""
    return float(np.float32(value))


def _same(read: Any, expected: Any) -> bool:
    """Equal bit for bit, NaN equal to NaN."""
    return json.dumps(read, sort_keys=True) == json.dumps(expected, sort_keys=True)


def _export(url: str, logdir: Path, *extra: str) -> Any:
    return CliRunner().invoke(main, ["--ledger", url, "tensorboard", NAME, "--logdir",
                                     str(logdir), *extra])


def test_event_files_equal_the_ledger_and_a_second_export_adds_only_new_points(
    ledger: Ledger, ledger_url: str, tmp_path: Path
) -> None:
    ids = _fill(ledger)
    logdir = tmp_path / "tb"
    first = _export(ledger_url, logdir)
    assert first.exit_code == 0, first.output
    assert first.output.strip() == "51 new points of 4 runs written to " + str(logdir)
    assert _same(_read_back(logdir), _ledger_points(ledger))
    again = _export(ledger_url, logdir)
    assert again.output.strip().startswith("0 new points of 0 runs")
    with ledger.metric_writer(ids["running"], _segment(ledger, ids["running"])) as metrics:
        metrics.log("train/loss", 11, 0.1 + 0.2, 176)
        metrics.log("grad/norm", 11, 2.0**-30, 176)  # a key that appears later
    later = _export(ledger_url, logdir)
    assert later.output.strip().startswith("2 new points of 1 runs")
    assert _same(_read_back(logdir), _ledger_points(ledger))
    # the config as hyperparameters, the status as text (TensorBoard's accumulator)
    folder = next(logdir.glob(f"*/seed-*-{ids['nan']}"))
    accumulator = event_accumulator.EventAccumulator(str(folder), size_guidance={"tensors": 0})
    accumulator.Reload()
    tags = accumulator.Tags()["tensors"]
    assert hparams_metadata.SESSION_START_INFO_TAG in tags
    assert hparams_metadata.SESSION_END_INFO_TAG in tags
    start = accumulator.SummaryMetadata(hparams_metadata.SESSION_START_INFO_TAG)
    info = hparams_metadata.parse_session_start_info_plugin_data(start.plugin_data.content)
    assert info.hparams["optimizer.lr"].number_value == 1e-4
    status = accumulator.Tensors("run/status")[-1]
    assert tensor_util.make_ndarray(status.tensor_proto).item().decode() == (
        "status: diverged; stop: non_finite_loss at update 11")


def test_a_run_resumed_while_exported_ends_with_its_newest_segment(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The old segment logged to 20; the run resumes from 10 and has re-run 11-13 when an
    export reads it; it then logs 14-25 and completes. The event files end as the ledger:
    every step after 10 from the newest segment (none stuck at the old segment's value)."""
    with Ledger.open(sqlite_url, create=True) as ledger:
        plan_campaign(ledger, NAME, seeds=1, variants={"lr-1e-4": 1e-4})
        claim = ledger.claim_next(NAME, "test")
        assert claim is not None
        with ledger.metric_writer(claim.run_id, claim.segment_id) as metrics:
            for step in range(1, 21):
                metrics.log("train/loss", step, 1.0 / step, 16 * step)
        ledger.finish(claim.run_id, "interrupted", StopRecord("interrupted", 20, "update"))
        again = ledger.start(claim.run_id, "test-2", start_step=10)
        logdir = tmp_path / "tb"
        with ledger.metric_writer(claim.run_id, again.segment_id) as metrics:
            for step in range(11, 14):
                metrics.log("train/loss", step, 100.0 + step, 16 * step)
        assert _export(sqlite_url, logdir).exit_code == 0  # mid-resume: 1-10 old, 11-13 new
        with ledger.metric_writer(claim.run_id, again.segment_id) as metrics:
            for step in range(14, 26):
                metrics.log("train/loss", step, 100.0 + step, 16 * step)
        ledger.finish(claim.run_id, "completed", StopRecord("budget_reached", 25, "update"))
        assert _export(sqlite_url, logdir).exit_code == 0
        (folder,) = _read_back(logdir)
        series = _read_back(logdir)[folder]["train/loss"]
        assert series == [(s, _f32(1.0 / s)) for s in range(1, 11)] + [
            (s, 100.0 + s) for s in range(11, 26)]
        assert _same(_read_back(logdir), _ledger_points(ledger))


def _segment(ledger: Ledger, run_id: str) -> int:
    segments = ledger.segments(NAME)
    return int(segments[segments["run_id"] == run_id]["segment_id"].max())


def test_follow_picks_up_new_points_and_ends_with_the_campaign(
    sqlite_url: str, tmp_path: Path
) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        ids = _fill(ledger)
    logdir = tmp_path / "tb"
    follower = start(sqlite_url, "tensorboard", NAME, "--logdir", str(logdir), "--follow",
                     "--every-s", "0.3")
    try:
        state = logdir / ".campaign-tensorboard.json"
        wait_for(state.exists, 60, "the first export")
        with Ledger.open(sqlite_url) as ledger:
            with ledger.metric_writer(ids["running"], _segment(ledger, ids["running"])) as m:
                m.log("train/loss", 11, 1 / 7, 176)

            def exported() -> bool:
                folder = next(k for k in _read_back(logdir) if k.endswith(ids["running"]))
                return _read_back(logdir)[folder]["train/loss"][-1] == (11, _f32(1 / 7))

            wait_for(exported, 60, "the new point in the event files")
            ledger.finish(ids["running"], "completed", StopRecord("budget_reached", 11, "update"))
            assert follower.wait(timeout=60) == 0
            assert _same(_read_back(logdir), _ledger_points(ledger))
        assert "every run has ended" in follower.stderr.read()
    finally:
        if follower.poll() is None:
            follower.kill()


def test_a_folder_that_is_not_ours_is_one_line(sqlite_url: str, tmp_path: Path) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        _fill(ledger)
        plan_campaign(ledger, "other", seeds=1)
    a_file = tmp_path / "plain.txt"
    a_file.write_text("not a folder")
    refused = _export(sqlite_url, a_file)
    assert refused.exit_code == 2 and "is a file" in refused.output
    logdir = tmp_path / "tb"
    assert _export(sqlite_url, logdir).exit_code == 0
    other = CliRunner().invoke(main, ["--ledger", sqlite_url, "tensorboard", "other",
                                      "--logdir", str(logdir)])
    assert other.exit_code == 2
    assert f"holds campaign '{NAME}', not 'other'" in other.output
    missing = CliRunner().invoke(main, ["--ledger", sqlite_url, "tensorboard", "nope",
                                        "--logdir", str(tmp_path / "x")])
    assert missing.exit_code == 2 and "no campaign named 'nope'" in missing.output
    assert not (tmp_path / "x").exists()


def test_a_relaunch_is_kept_apart_with_its_lineage(sqlite_url: str, tmp_path: Path) -> None:
    """Issue 26: a relaunch was filed as another seed-0 run of its variant."""
    with Ledger.open(sqlite_url, create=True) as ledger:
        ids = _fill(ledger)
        config = ledger.run(ids["nan"]).config_document
        again = ledger.add_run(NAME, "lr-1e-4", 1, config, relaunch_of=ids["nan"],
                               reason="diverged: once more")
        claim = ledger.start(again, "test")
        with ledger.metric_writer(again, claim.segment_id) as metrics:
            metrics.log("train/loss", 1, 0.25, 16)
        ledger.finish(again, "completed", StopRecord("budget_reached", 1, "update"))
    logdir = tmp_path / "tb"
    assert _export(sqlite_url, logdir).exit_code == 0
    folders = {str(p.relative_to(logdir)) for p in logdir.glob("*/*") if p.is_dir()}
    assert f"lr-1e-4/relaunch-seed-1-{again}-of-{ids['nan']}" in folders
    assert not any(f.endswith(f"seed-1-{again}") and "relaunch" not in f for f in folders)
    mux = multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    run = f"lr-1e-4/relaunch-seed-1-{again}-of-{ids['nan']}"
    content = mux.PluginRunToTagToContent(hparams_metadata.PLUGIN_NAME)[run]
    start = hparams_metadata.parse_session_start_info_plugin_data(
        content[hparams_metadata.SESSION_START_INFO_TAG])
    assert start.hparams["relaunch_of"].string_value == ids["nan"]
    assert start.hparams["relaunch_reason"].string_value == "diverged: once more"


def _served(url: str) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """run -> key -> [(step, value)] as the scalar dashboard asks the server for them."""
    def ask(path: str) -> Any:
        with urllib.request.urlopen(url + path, timeout=10) as answer:
            return json.loads(answer.read())

    return {run: {key: [(int(step), float(value)) for _, step, value in ask(
                "/data/plugin/scalars/scalars?" + urllib.parse.urlencode({"run": run, "tag": key}))]
                  for key in keys}
            for run, keys in ask("/data/plugin/scalars/tags").items()}


def test_a_default_tensorboard_server_shows_every_scalar(sqlite_ledger: Ledger, sqlite_url: str,
                                                         tmp_path: Path) -> None:
    """`tensorboard --logdir DIR`, as users start it (its default, fast loader: a Rust data
    server that drops float64 scalars without a word), serves every point of every run."""
    _fill(sqlite_ledger)
    logdir = tmp_path / "tb"
    assert _export(sqlite_url, logdir).exit_code == 0
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--port", str(port),
         "--host", "127.0.0.1", "--reload_interval", "1",
         "--load_fast", "true"],  # its default, without the silent fall back to Python
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    expected = _ledger_points(sqlite_ledger)
    try:
        url = f"http://127.0.0.1:{port}"

        def complete() -> bool:
            try:
                return _served(url) == expected or _same(_served(url), expected)
            except OSError:
                return False

        wait_for(complete, 90, "every scalar from the TensorBoard server", every=1)
    finally:
        server.kill()
        server.wait(timeout=30)


def test_a_folder_holding_an_earlier_float64_export_is_not_added_to(
        sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path) -> None:
    """An export before float32 scalars wrote float64 ones, which the default loader does not
    show: adding float32 points to those runs would show half a curve. One line, exit 2."""
    _fill(sqlite_ledger)
    logdir = tmp_path / "tb"
    assert _export(sqlite_url, logdir).exit_code == 0
    state_file = logdir / ".campaign-tensorboard.json"
    state = json.loads(state_file.read_text())
    del state["scalars"]  # as that version wrote it
    state_file.write_text(json.dumps(state))
    again = _export(sqlite_url, logdir)
    assert again.exit_code == 2 and "earlier export's float64 scalars" in again.output
    assert len(again.output.strip().splitlines()) == 1
