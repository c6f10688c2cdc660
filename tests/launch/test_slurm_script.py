"""What the SLURM executor writes before anything is submitted: its batch script never through
a link planted in a shared job folder, and no option value that would add a line to it."""

from __future__ import annotations

import stat
from pathlib import Path

from click.testing import CliRunner

from campaign.cli import main
from campaign.launch.slurm_executor import write_private
from campaign.ledger import Ledger
from tests.support.loop_helpers import plan_quick


def test_the_batch_script_replaces_a_planted_link_and_never_writes_its_target(
        tmp_path: Path) -> None:
    victim = tmp_path / "someone-elses.txt"
    victim.write_text("theirs\n")
    victim.chmod(0o644)
    shared = tmp_path / "jobs"
    shared.mkdir()
    (shared / "study.sbatch").symlink_to(victim)
    written = write_private(shared / "study.sbatch", "#!/bin/bash\n")
    assert victim.read_text() == "theirs\n" and stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert not written.is_symlink() and written.read_text() == "#!/bin/bash\n"
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert sorted(p.name for p in shared.iterdir()) == ["study.sbatch"]  # no temporary left


def test_a_partition_that_would_add_a_line_to_the_script_is_refused(sqlite_ledger: Ledger,
                                                                     sqlite_url: str,
                                                                     tmp_path: Path) -> None:
    plan_quick(sqlite_ledger, "parted", runs=1)
    result = CliRunner().invoke(main, [
        "--ledger", sqlite_url, "launch", "parted", "--executor", "slurm", "--skip-pilot",
        "--reason", "t", "--artifacts", str(tmp_path / "a"),
        "--slurm-partition", "debug\n#SBATCH --uid=0"])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert "not a SLURM partition name" in line
    assert sqlite_ledger.runs("parted")["status"].tolist() == ["planned"]


def test_a_script_name_taken_by_a_folder_is_one_placement_error(tmp_path: Path) -> None:
    import pytest

    from campaign.launch.placement import PlacementError

    (tmp_path / "study.sbatch").mkdir()
    with pytest.raises(PlacementError, match="cannot write the batch script"):
        write_private(tmp_path / "study.sbatch", "#!/bin/bash\n")
    assert [p.name for p in tmp_path.iterdir()] == ["study.sbatch"]  # no temporary left
