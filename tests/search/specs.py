"""Search specs on the digits task, written for a test's folder."""

from __future__ import annotations

from pathlib import Path

from tests.support.launch_helpers import invoke

BASE = """
[campaign]
name = "{name}"
question = "Which learning rate and width give the best validation accuracy?"
task = "campaign.tasks.digits:build"

[hold]
"loop.microbatch" = 16
"loop.accumulation" = 1
"budget.updates" = 30

[config]
"optimizer.name" = "adamw"
"optimizer.lr" = 1e-3
"task.hidden" = 32

[validation]
every = 10
metric = "val/accuracy"
mode = "max"

[grid]
seeds = [0, 1, 2]
control = "base"

[[grid.variants]]
name = "base"

[search]
{search}

[search.space]
"optimizer.lr" = {{ log_uniform = [1e-4, 3e-2] }}
"task.hidden" = {{ choice = [16, 32] }}
"""

HALVING = """method = "halving"
trials = 6
rungs = [10, 20]
keep = 0.5
audit = 0.5
confirm = 2
confirm_seeds = [10, 11, 12]
"""

TPE = """method = "tpe"
trials = 6
cohort = 3
confirm = 1
confirm_seeds = [10, 11, 12]
"""


def write_spec(folder: Path, name: str, search: str = HALVING, **replace: str) -> Path:
    text = BASE.format(name=name, search=search)
    for old, new in replace.items():
        text = text.replace(old, new)
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def plan_and_pilot(url: str, spec: Path, name: str, pilots: Path) -> None:
    """`campaign plan SPEC` and `campaign pilot NAME`, both passing."""
    for args in (("plan", str(spec)), ("pilot", name, "--artifacts", str(pilots))):
        done = invoke(url, *args)
        assert done.returncode == 0, done.stderr[-2000:]
