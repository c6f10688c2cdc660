"""A replay is not a verdict when it was killed (docs/report.md, flags): a run's replay check
whose process is killed by a signal nobody of ours sent is retried once; killed again, the run
records that its replay was interrupted (flag ``replay_interrupted``, not ``replay_differs``),
and a later ``campaign replay`` with identical outputs clears the flag while both events stay.
The run's replay child is a real child of the task host, killed by SIGKILL."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from campaign.cli import main
from campaign.ledger import Ledger
from campaign.report.flags import event_flags
from tests.support.loop_helpers import plan_loop

TASK = "tests.support.tasks.faulty:build"
SKIP = ("--skip-pilot", "--reason", "a test of the replay check, not of the pilot")


def _run_with_killed_replays(tmp_path: Path, kills: int) -> tuple[str, str]:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger.open(url, create=True) as ledger:
        (run_id,) = plan_loop(ledger, "replays", task=TASK,
                              config={"task.fault": "killed_replays", "task.at": kills,
                                      "task.marker": str(tmp_path / "replays")})
    done = CliRunner().invoke(main, ["--ledger", url, "run", run_id, "--artifacts",
                                     str(tmp_path / "a"), *SKIP])
    assert done.exit_code == 0, done.output  # the run completed: a replay is no verdict
    return url, run_id


def _flags(url: str) -> list[str]:
    with Ledger.open(url) as ledger:
        return [f["kind"] for f in event_flags(ledger.events("replays"))]


def _replay_events(url: str) -> list[str]:
    with Ledger.open(url) as ledger:
        events = ledger.events("replays")
    return [str(d) for d in events.loc[events["kind"] == "replay", "detail"]]


def test_a_replay_killed_once_is_retried_and_raises_no_flag(tmp_path: Path) -> None:
    url, _ = _run_with_killed_replays(tmp_path, kills=1)
    assert _flags(url) == []
    (only,) = _replay_events(url)
    assert "outputs identical" in only
    assert (tmp_path / "replays").read_text() == "1"  # the first replay was really killed


def test_a_replay_killed_twice_is_interrupted_and_a_later_replay_clears_it(
        tmp_path: Path) -> None:
    url, run_id = _run_with_killed_replays(tmp_path, kills=2)
    assert _flags(url) == ["replay_interrupted"]
    (interrupted,) = _replay_events(url)
    assert "was interrupted" in interrupted and "killed by SIGKILL twice" in interrupted
    again = CliRunner().invoke(main, ["--ledger", url, "replay", run_id])
    assert again.exit_code == 0, again.output
    assert _flags(url) == []
    assert [("was interrupted" in d, "outputs identical" in d)
            for d in _replay_events(url)] == [(True, False), (False, True)]
