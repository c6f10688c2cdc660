"""A run's process killed while its ledger is away (docs/runs.md, faults): the checkpoints it
wrote during the outage were waiting for the ledger, in the run folder as well as in memory; its
supervisor cannot write the end (the ledger is still away) and leaves it; once the ledger is
back, the next worker records those checkpoints, then the end (`interrupted`/`killed`), and
resumes the run from the newest of them. A private PostgreSQL cluster, real processes."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from campaign.ledger import Ledger
from campaign.loop.train import execute
from tests.support.launch_helpers import losses, start
from tests.support.loop_helpers import plan_loop
from tests.support.outages import SKIP, Cluster, outlived

TASK = "tests.support.tasks.faulty:build"
HOLD = {"loop.checkpoint_every": 2}
SLOW_STEPS = {"task.sleep": 0.7}  # per microbatch, two an update: 2.8 s to stop the server
# between the record of the checkpoint at 2 and the one at 4
AT = 11  # the 11th training microbatch: in update 6, after the checkpoint of update 4


def _checkpoints(ledger: Ledger, campaign: str) -> list[int]:
    found = ledger.artifacts(campaign)
    return sorted(found.loc[found["kind"] == "checkpoint", "step"].astype(int))


@pytest.mark.slow
def test_a_run_killed_in_an_outage_resumes_from_the_checkpoint_it_wrote_then(
        private_cluster: Cluster, tmp_path: Path) -> None:
    url = private_cluster.url
    with Ledger.open(url, create=True) as ledger:
        (twin,) = plan_loop(ledger, "twin", task=TASK, hold=HOLD)
        execute(ledger, twin, artifacts=tmp_path / "twin", replay_in_subprocess=False)
        (run_id,) = plan_loop(ledger, "killed", task=TASK, hold=HOLD,
                              config={**SLOW_STEPS, "task.fault": "selfkill", "task.at": AT,
                                      "task.marker": str(tmp_path / "killed-once")})
        art = tmp_path / "art"
        worker = start(url, "worker", "killed", "--artifacts", str(art), "--no-replay-check",
                       *SKIP, env={"CAMPAIGN_LEDGER_OUTAGE_S": "10"})
        outlived(worker, lambda: _checkpoints(ledger, "killed") == [2], "the checkpoint at 2",
                 private_cluster)
        folder = art / run_id
        assert (folder / "pending-end.json").exists() and (folder / "waiting-records.json").exists()
        private_cluster.ctl("start")
        resumed = start(url, "worker", "killed", "--artifacts", str(art), "--no-replay-check",
                        "--resume-interrupted", *SKIP)
        _, stderr = resumed.communicate(timeout=300)
        assert resumed.returncode == 0, stderr[-3000:]
        assert not (folder / "waiting-records.json").exists()
        segments = ledger.segments("killed")
        assert list(segments["start_step"]) == [0, 4], segments  # from the one kept
        assert _checkpoints(ledger, "killed").count(4) == 1  # recorded once
        kills = ledger.events("killed", run_id=run_id)
        ends = kills.loc[kills["kind"] == "interrupted", "detail"]
        assert len(ends) == 1 and "killed" in ends.iloc[0] and "ledger was away" in ends.iloc[0]
        assert ledger.run(run_id).status == "completed"
        pd.testing.assert_series_equal(losses(ledger, run_id), losses(ledger, twin),
                                       check_exact=True)
