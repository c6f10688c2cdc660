"""Exit codes the contract promises (docs/cli.md), through the real command line in-process:
1 for a failed run (in setup too) and a failing pilot gate; 3 and nothing created for a
reading command on a SQLite ledger that does not exist; --ledger on either side of the
subcommand."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from campaign.cli import main
from campaign.ledger import Ledger
from tests.support.loop_helpers import plan_loop

READING = [
    ["campaigns"], ["show", "loop"], ["runs", "loop"], ["status", "loop"], ["notes", "loop"],
    ["report", "loop"], ["archive", "loop"], ["doctor"], ["replay", "01NOSUCHRUN"],
]

SKIP = ("--skip-pilot", "--reason", "a test of exit codes, not of the pilot")


@pytest.mark.parametrize("command", READING, ids=lambda c: c[0])
def test_a_reading_command_refuses_a_missing_ledger(tmp_path: Path, command: list[str]) -> None:
    typo = tmp_path / "typo.db"
    result = CliRunner().invoke(main, [*command, "--ledger", f"sqlite:///{typo}"])
    assert result.exit_code == 3, result.output
    assert result.stderr == f"campaign: ledger error: no ledger at {typo}\n"
    assert result.stdout == ""
    assert not typo.exists()
    assert list(tmp_path.iterdir()) == []


def test_the_api_creates_only_when_asked(tmp_path: Path) -> None:
    from campaign.ledger import NoLedger

    typo = tmp_path / "typo.db"
    with pytest.raises(NoLedger, match=f"no ledger at {typo}"):
        Ledger.open(f"sqlite:///{typo}")
    assert not typo.exists()
    with Ledger.open(f"sqlite:///{typo}", create=True) as ledger:
        assert ledger.campaigns().empty
    assert typo.exists()


def test_ledger_option_before_or_after_the_subcommand(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger.open(url, create=True) as ledger:
        plan_loop(ledger)
    runner = CliRunner()
    before = runner.invoke(main, ["--ledger", url, "runs", "loop", "--format", "csv"])
    after = runner.invoke(main, ["runs", "loop", "--format", "csv", "--ledger", url])
    nested = runner.invoke(main, ["db", "current", "--ledger", url, "--format", "json"])
    assert before.exit_code == after.exit_code == nested.exit_code == 0, after.output
    assert after.stdout == before.stdout and after.stdout.count("\n") == 2  # header + one run
    assert '"state": "up to date"' in nested.stdout
    # After the subcommand wins over the environment, like the global option does.
    env_only = runner.invoke(main, ["runs", "loop", "--ledger", url],
                             env={"CAMPAIGN_LEDGER": "sqlite:///elsewhere.db"})
    assert env_only.exit_code == 0, env_only.output


def test_run_exits_1_when_the_run_fails_in_setup(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger.open(url, create=True) as ledger:
        run_id = plan_loop(ledger, task="tests.support.tasks.tiny:build_partial")[0]  # no model()
    ungated = CliRunner().invoke(main, ["--ledger", url, "run", run_id])
    assert ungated.exit_code == 1 and "has no passing pilot" in ungated.stderr  # nothing ran
    with Ledger.open(url) as ledger:
        assert ledger.run(run_id).status == "planned"
    result = CliRunner().invoke(main, ["--ledger", url, "run", run_id, *SKIP,
                                       "--artifacts", str(tmp_path / "a")])
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"run {run_id}: failed (exception) at update 0: run "
                                    f"{run_id} failed in setup")
    assert "Traceback" not in result.output
    with Ledger.open(url) as ledger:
        assert ledger.run(run_id).status == "failed"


def test_run_exits_1_when_the_run_fails(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger.open(url, create=True) as ledger:
        run_id = plan_loop(
            ledger, task="tests.support.tasks.faulty:build",
            config={"task.fault": "raise", "task.at": 2},
        )[0]
    result = CliRunner().invoke(main, ["--ledger", url, "run", run_id, *SKIP,
                                       "--artifacts", str(tmp_path / "a")])
    assert result.exit_code == 1, result.output
    assert f"run {run_id}: failed (exception)" in result.stderr


def test_pilot_exits_1_on_a_failing_gate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger.open(url, create=True) as ledger:
        plan_loop(ledger, task="tests.support.tasks.broken:digits",
                  config={"task.fault": "duplicate_ids"})
    result = CliRunner().invoke(main, ["--ledger", url, "pilot", "loop",
                                       "--artifacts", str(tmp_path / "a")])
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().endswith("FAILED")
    assert "fail" in result.stdout.splitlines()[2]  # the data phase's row


@pytest.mark.parametrize("value", ["abc", "0", "-5", "inf", "nan", "3000000"])
def test_a_busy_timeout_that_is_not_seconds_is_one_ledger_error(
    sqlite_ledger: Ledger, sqlite_url: str, value: str
) -> None:
    """Read when a connection is made (a run's process takes its command's value), never at
    import: a bad value is exit 3 naming the variable, no traceback."""
    result = CliRunner().invoke(main, ["--ledger", sqlite_url, "campaigns"],
                                env={"CAMPAIGN_SQLITE_BUSY_TIMEOUT_S": value})
    assert result.exit_code == 3, result.output
    assert result.stderr == (f"campaign: ledger error: CAMPAIGN_SQLITE_BUSY_TIMEOUT_S={value!r}: "
                             "not a number of seconds above 0 and at most 2,000,000\n")


@pytest.mark.parametrize("arguments", [
    ["doctor", "--stale-after", "nan"], ["doctor", "--stale-after", "inf"],
    ["doctor", "--stale-after", "1e300"], ["launch", "c", "--grace-s", "nan"],
    ["launch", "c", "--gpus-per-run", "nan"], ["launch", "c", "--gpus-per-run", "inf"],
    ["launch", "c", "--stop-grace-s", "nan"], ["launch", "c", "--schedule-timeout-s", "nan"],
    ["launch", "c", "--heartbeat-s", "nan"], ["tensorboard", "c", "--logdir", "tb",
                                              "--every-s", "nan"],
    ["pilot", "c", "--overfit-factor", "nan"], ["size", "c", "--reserve", "nan"],
])
def test_a_number_option_refuses_nan_inf_and_absurd_values(sqlite_ledger: Ledger,
                                                           sqlite_url: str,
                                                           arguments: list[str]) -> None:
    """click's own float ranges let NaN through (it compares false with both bounds) and an
    infinity past a lower bound alone: each was a traceback later, or accepted."""
    result = CliRunner().invoke(main, ["--ledger", sqlite_url, *arguments])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert f"Invalid value for '{arguments[-2]}'" in line and "Traceback" not in result.output


def test_an_argument_that_is_not_utf8_is_one_line(sqlite_ledger: Ledger, sqlite_url: str) -> None:
    """A note of bytes that are not UTF-8 (as a shell passes them) was an encoding traceback
    from the ledger's driver; nothing is written."""
    result = CliRunner().invoke(main, ["--ledger", sqlite_url, "note", "c", "\udcff\udcfe"])
    assert result.exit_code == 2
    assert result.stderr == "campaign: argument 5 (b'\\xff\\xfe') is not UTF-8 text\n"


def test_a_closed_standard_output_is_said_not_exit_0(sqlite_ledger: Ledger,
                                                     sqlite_url: str) -> None:
    """Python gives a closed stdout as None, and click then prints nothing: `runs` exited 0
    having shown nothing."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "campaign", "--ledger", sqlite_url,
                           "campaigns"], stderr=subprocess.PIPE, text=True, timeout=120,
                          preexec_fn=lambda: os.close(1))
    assert done.returncode == 2 and "standard output is closed" in done.stderr


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_an_in_memory_ledger_is_refused(tmp_path: Path, url: str) -> None:
    """It planned into a database that vanished with the command, and exited 0."""
    spec = Path(__file__).resolve().parents[2] / "examples" / "digits-lr.toml"
    result = CliRunner().invoke(main, ["--ledger", url, "plan", str(spec)])
    assert result.exit_code == 2 and "in-memory SQLite ledger" in result.stderr


@pytest.mark.parametrize("given", ["option", "environment"])
def test_an_artifacts_folder_under_a_file_is_refused_before_the_claim(
        sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path, given: str) -> None:
    """It was a NotADirectoryError traceback after the claim, and the run stayed `running`
    with no process."""
    (run_id,) = plan_loop(sqlite_ledger)
    (tmp_path / "a-file").write_text("")
    under = str(tmp_path / "a-file" / "artifacts")
    arguments = ["--ledger", sqlite_url, "run", run_id, "--skip-pilot", "--reason", "t"]
    result = CliRunner().invoke(main, [*arguments, "--artifacts", under] if given == "option"
                                else arguments, env={"CAMPAIGN_ARTIFACTS": under})
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert f"{tmp_path / 'a-file'} is a file, not a folder" in line
    assert sqlite_ledger.run(run_id).status == "planned"


def test_archive_to_standard_output_is_refused_not_a_file_named_dash(
        sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    plan_loop(sqlite_ledger)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["--ledger", sqlite_url, "archive", "loop", "--output",
                                       "-"])
    assert result.exit_code == 2 and "--output -: an archive is a binary" in result.stderr
    assert not (tmp_path / "-").exists()


def test_archive_refuses_a_fifo_in_an_artifacts_place_unread(
        sqlite_ledger: Ledger, sqlite_url: str, tmp_path: Path) -> None:
    """It hung for ever reading it."""
    import os

    (run_id,) = plan_loop(sqlite_ledger)
    done = CliRunner().invoke(main, ["--ledger", sqlite_url, "run", run_id, "--skip-pilot",
                                     "--reason", "t", "--artifacts", str(tmp_path / "a"),
                                     "--no-replay-check"])
    assert done.exit_code == 0, done.output
    artifacts = sqlite_ledger.artifacts("loop")
    final = Path(artifacts.loc[artifacts["kind"] == "final", "path"].iloc[-1])
    final.unlink()
    os.mkfifo(final)
    result = CliRunner().invoke(main, ["--ledger", sqlite_url, "archive", "loop", "--output",
                                       str(tmp_path / "x.tar.gz")])
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.strip().splitlines()
    assert f"{final} is not a regular file: refused unread" in line
    assert not (tmp_path / "x.tar.gz").exists()
