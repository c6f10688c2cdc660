"""What the SLURM and Ray tests share: a ledger URL with a password in it, the search for that
password everywhere a launch leaves traces, and the ledger reads they wait and judge on."""

from __future__ import annotations

from pathlib import Path

import psutil

from campaign.ledger import Ledger
from tests.support.launch_helpers import last_step

SECRET = "3ngine-pw-41"


def with_password(postgresql_url: str) -> str:
    """The test database's URL with a password (trust authentication accepts any)."""
    user, rest = postgresql_url.split("://", 1)[1].split("@", 1)
    return f"postgresql+psycopg://{user}:{SECRET}@{rest}"


def command_line(process: psutil.Process) -> list[str]:
    """A process's argv, or nothing for one that ended (a zombie) while it was listed."""
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def no_secret_in(*folders: Path) -> None:
    """The password is in no file under ``folders`` and on no command line of this machine."""
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert SECRET.encode() not in path.read_bytes(), path
    for process in psutil.process_iter():
        assert SECRET not in " ".join(command_line(process)), process.pid


def running_past(ledger: Ledger, campaign: str, step: int) -> list[tuple[str, str]]:
    """(run id, worker) of each running run past ``step``."""
    running = ledger.runs(campaign, status="running")
    return [(str(r.run_id), str(r.worker)) for r in running.itertuples()
            if last_step(ledger, str(r.run_id)) >= step]


def checkpoint_steps(ledger: Ledger, campaign: str, run_id: str) -> set[int]:
    artifacts = ledger.artifacts(campaign)
    mine = artifacts[(artifacts["run_id"] == run_id) & (artifacts["kind"] == "checkpoint")]
    return {int(step) for step in mine["step"]}
