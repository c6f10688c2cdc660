"""A mirror run again: what is already on an MLflow server, read from each run's
``campaign.points_through`` tag against one metric history per key per run.

    python benchmarks/mirror.py [--runs 40] [--keys 6] [--points 200] [--rounds 3]

A real ``mlflow server`` on loopback (SQLite backend store) holds ``--runs`` runs of
``--keys`` keys x ``--points`` steps, mirrored by ``campaign.report.mlflow_mirror``. Then a
repeat pass over every run, which has nothing new to send, is timed two ways in
rotating order: with the tag as the mirror writes it, and with the tag emptied (what a
run mirrored before the tag existed, or with too many keys for one tag, costs: every
key's history read back). Both are the product's own code (``_send_points``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
from common import interleaved, report

from campaign.report.mlflow_mirror import POINTS_TAG, _send_points
from tests.support.mlflow_server import mlflow_server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--keys", type=int, default=6)
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory() as folder, mlflow_server(Path(folder)) as uri:
        client = MlflowClient(tracking_uri=uri)
        experiment = client.create_experiment("bench")
        runs: list[tuple[str, pd.DataFrame]] = []
        for index in range(args.runs):
            run_id = client.create_run(experiment).info.run_id
            points = pd.DataFrame(
                [{"key": f"train/k{k}", "step": s, "value": 1.0 / (s + k + 1),
                  "wall_time": pd.Timestamp("2026-12-06", tz="UTC")}
                 for k in range(args.keys) for s in range(args.points)])
            _send_points(client, client.get_run(run_id), points, True)
            runs.append((run_id, points))
            print(f"\rmirrored {index + 1}/{args.runs} runs", end="", file=sys.stderr)
        print(file=sys.stderr)
        tagged = {run_id: client.get_run(run_id) for run_id, _ in runs}

        def with_tag() -> None:
            for run_id, points in runs:
                assert _send_points(client, tagged[run_id], points, False) == 0

        untagged = {run_id: SimpleNamespace(info=run.info, data=SimpleNamespace(
            tags={k: v for k, v in run.data.tags.items() if k != POINTS_TAG}))
            for run_id, run in tagged.items()}  # as a run mirrored before the tag

        def histories() -> None:  # every key read back (and the tag written again)
            for run_id, points in runs:
                assert _send_points(client, untagged[run_id], points, False) == 0

        medians = interleaved({"histories (one per key per run)": histories,
                               "points_through tag": with_tag}, args.rounds)
        report(f"A repeat mirror of {args.runs} runs x {args.keys} keys x {args.points} "
               "points, nothing new", medians, "histories (one per key per run)",
               args.runs, "runs")


if __name__ == "__main__":
    main()
