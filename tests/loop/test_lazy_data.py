"""A lazy dataset of ten million examples (generated on access): planning, the gates (on a
seeded sample, said so) and a 20-update run complete, with a peak RSS within 100 MiB of the
same task with ten thousand examples: nothing materialises a split."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.launch_helpers import ROOT

SPEC = """[campaign]
name = "lazy"
question = "Does a ten-million-example split fit?"
task = "tests.support.tasks.augmented:build"
[hold]
"loop.microbatch" = 8
"loop.accumulation" = 2
"budget.updates" = 20
[config]
"optimizer.lr" = 0.01
"task.train_size" = {size}
[validation]
every = 10
metric = "val/accuracy"
mode = "max"
[grid]
seeds = [0]
control = "only"
[[grid.variants]]
name = "only"
set = {{}}
"""

# plan, pilot (the data gate and every phase), run: each a real command, all in this one
# process (click's runner), so that their children come from one task host, as a user's
# commands each have theirs. The peak RSS of every process they started is what
# RUSAGE_CHILDREN keeps once the host has ended (a host's reaped children count through it);
# this process's own peak is checked too (a command that read a whole split in its process).
WRAPPER = """
import json, resource, sys
from click.testing import CliRunner
from campaign.cli import main
from campaign.host import client
url, spec, artifacts = sys.argv[1:4]

def command(*args):
    done = CliRunner().invoke(main, ["--ledger", url, *args])
    assert done.exit_code == 0, (args, done.output[-3000:], done.exception)
    return done

command("plan", spec)
pilot = command("pilot", "lazy").output  # its table names what failed
run_id = json.loads(command("runs", "lazy", "--format", "json").stdout)[0]["run_id"]
command("run", run_id, "--artifacts", artifacts)
client.current().close()  # waited for: its peak, and its children's, are this process's now
peaks = [resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF,
                                                        resource.RUSAGE_CHILDREN)]
print(json.dumps({"peak_kib": peaks, "pilot": pilot}))
"""


def _peak(tmp_path: Path, size: int) -> dict[str, object]:
    folder = tmp_path / str(size)
    folder.mkdir()
    spec = folder / "lazy.toml"
    spec.write_text(SPEC.format(size=size))
    done = subprocess.run(
        [sys.executable, "-c", WRAPPER, f"sqlite:///{folder / 'ledger.db'}", str(spec),
         str(folder / "artifacts")],
        capture_output=True, text=True, cwd=ROOT, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_ten_million_lazy_examples_plan_pass_the_gates_and_train_in_bounded_memory(
    tmp_path: Path,
) -> None:
    small = _peak(tmp_path, 10_000)
    large = _peak(tmp_path, 10_000_000)
    assert "sampled" not in str(small["pilot"])
    assert "a seeded sample of 20,000 of 10,000,000 examples" in str(large["pilot"])
    for who, before, after in zip(("this process", "its children"), small["peak_kib"],
                                  large["peak_kib"], strict=True):
        grown = (int(after) - int(before)) / 1024
        assert grown < 100, f"the peak RSS of {who} grew by {grown:.0f} MiB"
