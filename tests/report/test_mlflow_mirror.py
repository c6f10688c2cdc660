"""``campaign mirror --to mlflow`` against a real ``mlflow server`` on loopback (SQLite backend
store, artifacts in a folder of the test's), read back with MLflow's own ``MlflowClient``: the
counts, tags, params and metric series equal the ledger's; run again, it adds only what is new."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from campaign.ledger import Ledger
from campaign.loop.train import execute
from tests.conftest import require
from tests.support.launch_helpers import run
from tests.support.loop_helpers import plan_quick
from tests.support.mlflow_server import mlflow_server as running_mlflow_server
from tests.support.ray_cluster import random_ports

pytestmark = pytest.mark.engine
require("mlflow", "mlflow")


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    folder = tmp_path / "mlflow"
    folder.mkdir()
    with running_mlflow_server(folder) as uri:
        yield uri


def _children(client, experiment_id: str) -> dict[str, object]:
    runs = client.search_runs([experiment_id], max_results=1000)
    return {r.data.tags["campaign.run_id"]: r for r in runs if "campaign.run_id" in r.data.tags}


@pytest.mark.slow
def test_a_campaign_mirrors_to_mlflow_and_a_second_mirror_adds_only_what_is_new(
    sqlite_url: str, tmp_path: Path, mlflow_server: str
) -> None:
    from mlflow.tracking import MlflowClient

    with Ledger.open(sqlite_url, create=True) as ledger:
        first, second, third = plan_quick(ledger, "mirrored", runs=3, updates=6,
                                          validation_every=3)
        for run_id in (first, second):
            execute(ledger, run_id, artifacts=tmp_path / "art", replay_in_subprocess=False)
    done = run(sqlite_url, "mirror", "mirrored", "--to", "mlflow", "--tracking-uri",
               mlflow_server)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == ""  # MLflow's own "View run" lines kept off the command's stdout
    assert "mirrored 3 runs of 'mirrored'" in done.stderr and "(3 new, 0 updated" in done.stderr

    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("mirrored")
    children = _children(client, experiment.experiment_id)
    with Ledger.open(sqlite_url) as ledger:
        runs = ledger.runs("mirrored").set_index("run_id")
        points = ledger.metrics("mirrored")
    assert set(children) == set(runs.index)
    for run_id, mirrored in children.items():
        row, tags = runs.loc[run_id], mirrored.data.tags
        assert (tags["campaign.variant"], tags["campaign.seed"], tags["campaign.status"]) == (
            row["variant"], str(row["seed"]), row["status"])
        cause = row["stop_cause"] if isinstance(row["stop_cause"], str) else ""
        assert tags["campaign.stop_cause"] == cause
        assert mirrored.data.params["optimizer.lr"] == str(row["config"]["optimizer"]["lr"])
        assert mirrored.info.status == ("FINISHED" if row["status"] == "completed"
                                        else "SCHEDULED")
        mine = points[points["run_id"] == run_id]
        for key, series in mine.groupby("key"):
            history = sorted((m.step, m.value) for m in client.get_metric_history(
                mirrored.info.run_id, key))
            assert history == sorted(zip(series["step"].astype(int), series["value"],
                                         strict=True)), key
        artifacts = {a.path for a in client.list_artifacts(mirrored.info.run_id)}
        assert artifacts == ({"model_card.md"} if row["status"] == "completed" else set())
    parent = next(r for r in client.search_runs([experiment.experiment_id])
                  if r.data.tags.get("campaign.campaign") == "mirrored")
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} == {"report.html",
                                                                             "spec.json"}
    assert all(r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
               for r in children.values())

    again = run(sqlite_url, "mirror", "mirrored", "--to", "mlflow", "--tracking-uri",
                mlflow_server)
    assert again.returncode == 0 and "(0 new, 0 updated, 0 new points)" in again.stderr
    _what_is_there_is_read_from_the_tag(client, experiment.experiment_id, points)
    assert client.get_run(parent.info.run_id).info.status == "RUNNING"  # one run planned

    # The third run trains and the first is relaunched: one run more, one updated.
    with Ledger.open(sqlite_url) as ledger:
        execute(ledger, third, artifacts=tmp_path / "art", replay_in_subprocess=False)
        relaunched = ledger.add_run("mirrored", "only", 0, ledger.run(first).config_document,
                                    relaunch_of=first, reason="a second look")
        added = len(ledger.metrics(runs=[third]))
    last = run(sqlite_url, "mirror", "mirrored", "--to", "mlflow", "--tracking-uri",
               mlflow_server)
    assert last.returncode == 0, last.stderr[-3000:]
    assert f"(1 new, 1 updated, {added} new points)" in last.stderr, last.stderr
    children = _children(client, experiment.experiment_id)
    assert children[relaunched].data.tags["campaign.relaunch_of"] == first
    assert children[third].info.status == "FINISHED"
    assert len(client.search_runs([experiment.experiment_id])) == 5  # 4 runs and the parent
    # The campaign's parent run is running while a run is planned (the relaunch) or running.
    assert client.get_run(parent.info.run_id).info.status == "RUNNING"

    # Another ledger's campaign of the same name (another spec) is not mixed into it.
    other = f"sqlite:///{tmp_path / 'other.db'}"
    with Ledger.open(other, create=True) as ledger:
        plan_quick(ledger, "mirrored", runs=1, updates=8)
    clash = run(other, "mirror", "mirrored", "--to", "mlflow", "--tracking-uri", mlflow_server)
    lines = clash.stderr.strip().splitlines()
    assert clash.returncode == 1 and len(lines) == 1, clash.stderr
    assert "MLflow experiment 'mirrored' holds a campaign with another spec" in lines[0]
    # The same spec planned in another ledger (a reproduction, a colleague's copy) neither.
    twin = f"sqlite:///{tmp_path / 'twin.db'}"
    with Ledger.open(twin, create=True) as ledger:
        plan_quick(ledger, "mirrored", runs=3, updates=6, validation_every=3)
        assert ledger.campaign("mirrored").spec_sha256 == experiment.tags[
            "campaign.spec_sha256"]
    clash = run(twin, "mirror", "mirrored", "--to", "mlflow", "--tracking-uri", mlflow_server)
    lines = clash.stderr.strip().splitlines()
    assert clash.returncode == 1 and len(lines) == 1, clash.stderr
    assert "the same spec's campaign from another ledger" in lines[0]
    assert len(client.search_runs([experiment.experiment_id])) == 5
    # A path where no tracking API answers: one line, not the web page the server sent.
    lost = run(sqlite_url, "mirror", "mirrored", "--to", "mlflow", "--tracking-uri",
               f"{mlflow_server}/some/path")
    lines = lost.stderr.strip().splitlines()
    assert lost.returncode == 1 and len(lines) == 1, lost.stderr
    assert "no tracking server answers there (HTTP 404" in lines[0] and "<" not in lines[0]


def test_a_mirror_to_nowhere_or_of_nothing_is_one_line(sqlite_url: str) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        plan_quick(ledger, "alone", runs=1)
    (closed,) = random_ports(1)
    cases = [(["alone", "--tracking-uri", f"http://127.0.0.1:{closed}"], 1,
              f"no MLflow server answers at http://127.0.0.1:{closed}"),
             (["alone", "--tracking-uri", "./mlruns"], 2, "the address of an MLflow tracking"),
             (["alone", "--tracking-uri", "http://127.0.0.1:port"], 2, "not an address"),
             (["nosuch", "--tracking-uri", f"http://127.0.0.1:{closed}"], 2, "nosuch")]
    for arguments, code, words in cases:
        done = run(sqlite_url, "mirror", arguments[0], "--to", "mlflow", *arguments[1:])
        lines = done.stderr.strip().splitlines()
        assert done.returncode == code and len(lines) == 1 and words in lines[0], done.stderr


class _Counting:
    """A real MlflowClient whose metric-history reads are counted (what a mirror asks)."""

    def __init__(self, client) -> None:
        self.client, self.histories = client, 0

    def get_metric_history(self, run_id: str, key: str):
        self.histories += 1
        return self.client.get_metric_history(run_id, key)

    def __getattr__(self, name: str):
        return getattr(self.client, name)


def _what_is_there_is_read_from_the_tag(client, experiment_id: str, points) -> None:
    """Each mirrored run's points_through tag says, per key, the last step sent and how many
    points up to it; a mirror run again reads no history where the ledger agrees with it, and
    reads the history of a key where it does not (or where the tag is gone), sending nothing
    twice and writing the tag again."""
    import json

    from campaign.report.mlflow_mirror import POINTS_TAG, _send_points

    for run_id, mirrored in _children(client, experiment_id).items():
        mine = points[points["run_id"] == run_id]
        if mine.empty:
            assert POINTS_TAG not in mirrored.data.tags
            continue
        through = json.loads(mirrored.data.tags[POINTS_TAG])
        assert through == {str(key): [int(s["step"].max()), len(s)]
                           for key, s in mine.groupby("key")}
        counting = _Counting(client)
        assert _send_points(counting, mirrored, mine, False) == 0 and counting.histories == 0
        # A point that reached the ledger late (the counts disagree), and a run without the
        # tag (an older mirror): histories read, nothing sent, the tag written again.
        key = sorted(through)[0]
        for tags in ({POINTS_TAG: json.dumps({**through, key: [through[key][0], 1]})}, {}):
            client.set_tag(mirrored.info.run_id, POINTS_TAG, tags.get(POINTS_TAG, "{}"))
            stale = client.get_run(mirrored.info.run_id)
            counting = _Counting(client)
            assert _send_points(counting, stale, mine, False) == 0
            assert counting.histories == (1 if tags else len(through))
            fresh = client.get_run(mirrored.info.run_id)
            assert json.loads(fresh.data.tags[POINTS_TAG]) == through
