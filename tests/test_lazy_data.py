"""A lazy dataset of ten million examples (generated on access): planning, the gates (on a
seeded sample, said so) and a 20-update run complete, with a peak RSS within 100 MiB of the
same task with ten thousand examples: nothing materialises a split."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.launch_helpers import ROOT

SPEC = """[campaign]
name = "lazy"
question = "Does a ten-million-example split fit?"
task = "tests.tasks.augmented:build"
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

# plan, pilot (the data gate and every phase), run: each a real command; the peak RSS of
# every process they started (the run's own child included) is what RUSAGE_CHILDREN keeps.
WRAPPER = """
import json, resource, subprocess, sys
url, spec, artifacts = sys.argv[1:4]
steps = [["plan", spec], ["pilot", "lazy"]]
outputs = []
for step in steps:
    done = subprocess.run([sys.executable, "-m", "campaign", "--ledger", url, *step],
                          capture_output=True, text=True)
    outputs.append(done.stdout + done.stderr)
    assert done.returncode == 0, outputs[-1][-3000:]  # the pilot's table names what failed
run_id = json.loads(subprocess.run([sys.executable, "-m", "campaign", "--ledger", url, "runs",
                                    "lazy", "--format", "json"], capture_output=True,
                                   text=True).stdout)[0]["run_id"]
done = subprocess.run([sys.executable, "-m", "campaign", "--ledger", url, "run", run_id,
                       "--artifacts", artifacts], capture_output=True, text=True)
assert done.returncode == 0, done.stderr[-3000:]
print(json.dumps({"peak_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
                  "pilot": outputs[1]}))
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
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_ten_million_lazy_examples_plan_pass_the_gates_and_train_in_bounded_memory(
    tmp_path: Path,
) -> None:
    small = _peak(tmp_path, 10_000)
    large = _peak(tmp_path, 10_000_000)
    assert "sampled" not in str(small["pilot"])
    assert "a seeded sample of 20,000 of 10,000,000 examples" in str(large["pilot"])
    grown = (int(large["peak_kib"]) - int(small["peak_kib"])) / 1024
    assert grown < 100, f"peak RSS grew by {grown:.0f} MiB"
