"""Command-line start-up: a command that does not train answers about as fast as Python can
import its libraries.

    python benchmarks/cli_start.py [--rounds 15]

Each command is a fresh process (what a user waits for), run interleaved with
its yardstick round by round; medians and ratios are printed:

- ``campaign --help`` against ``python -c "import click"``: at most 2x;
- ``campaign status C`` and ``campaign runs C`` against
  ``python -c "import sqlalchemy"``: at most 2.5x each;
- ``campaign plan spec.toml --dry-run`` of the ``campaign init`` skeleton against
  ``python -c "import torch; import study_task"``: at most 1.3x;
- the same for a task that imports torch and nothing else (the skeleton's scikit-learn
  import would hide a command's own imports in the yardstick) against
  ``python -c "import torch, torch_task"``: at most 1.3x;
- ``campaign run RUN_ID`` of the skeleton's 100 updates, replay included, against
  ``benchmarks/bare_run.py`` (the same training by hand, safetensors, a forked
  replay): at most 1.5x;
- ``campaign launch C --workers 2``: the first update (from the ledger's clock)
  at most 1.5x ``python -c "import torch"`` after the command starts, and the
  gap between two runs on one worker (one run's end to the next one's start) at
  most 100 ms.

The digits campaign is planned once from ``examples/digits-lr.toml`` into a
temporary SQLite ledger (12 runs); the skeleton is planned with one seed per
round (its runs are consumed by ``campaign run``) and piloted once.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import interleaved

ROOT = Path(__file__).resolve().parents[1]
LIMITS = {"campaign --help": ("import click", 2.0),
          "campaign status": ("import sqlalchemy", 2.5),
          "campaign runs": ("import sqlalchemy", 2.5),
          "campaign plan --dry-run": ("import torch; import study_task", 1.3),
          "campaign plan --dry-run (torch only)": ("import torch, torch_task", 1.3),
          "campaign run (100 updates)": ("bare_run.py (100 updates)", 1.5),
          "launch: first update": ("import torch", 1.5)}
GAP_LIMIT_S = 0.1


def _campaign() -> list[str]:
    """The console script as users run it (``python -m campaign`` when it is not on PATH)."""
    script = shutil.which("campaign", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "campaign"]


def _runner(command: list[str], env: dict[str, str], cwd: Path) -> object:
    def run() -> None:
        subprocess.run(command, env=env, cwd=cwd, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    return run


def _skeleton(root: Path, env: dict[str, str], rounds: int) -> tuple[Path, list[str]]:
    """The ``campaign init`` skeleton with one seed per round, planned and piloted."""
    campaign = _campaign()
    subprocess.run([*campaign, "init", "study"], env=env, cwd=root, check=True,
                   capture_output=True)
    folder = root / "study"
    spec = (folder / "spec.toml").read_text()
    seeds = ", ".join(str(i) for i in range(rounds))
    spec = spec.replace("seeds = [0, 1, 2]", f"seeds = [{seeds}]")
    (folder / "spec.toml").write_text(spec)
    skeleton_env = {**env, "CAMPAIGN_LEDGER": f"sqlite:///{folder / 'campaign.db'}"}
    subprocess.run([*campaign, "plan", "spec.toml"], env=skeleton_env, cwd=folder, check=True,
                   capture_output=True)
    subprocess.run([*campaign, "pilot", "study"], env=skeleton_env, cwd=folder, check=True,
                   capture_output=True)
    listed = subprocess.run([*campaign, "runs", "study", "--format", "json"], env=skeleton_env,
                            cwd=folder, check=True, capture_output=True, text=True)
    import json

    runs = [r["run_id"] for r in json.loads(listed.stdout) if r["variant"] == "lr-1e-2"]
    return folder, runs


TORCH_TASK = '''"""A task that imports torch and nothing else: the plain yardstick."""
import torch


class Plain:
    def __init__(self, config):
        self.config = config

    def model(self):
        return torch.nn.Linear(2, 1)

    def splits(self):
        rows = [{"id": i, "x": [0.0, 0.0], "y": 0.0} for i in range(80)]
        return {"train": rows[:64], "val": rows[64:]}

    def collate(self, examples):
        return {"x": torch.tensor([e["x"] for e in examples])}

    def loss(self, model, batch):
        return model(batch["x"]).sum(), len(batch["x"])

    def predict(self, model, batch):
        return []

    def score(self, records):
        return {"mse": 0.0}

    def describe(self, example):
        return {}

    def control_inputs(self):
        return []


def build(config):
    return Plain(config)
'''


def _torch_only(root: Path) -> Path:
    """A folder with the torch-only task and the skeleton's spec pointed at it."""
    folder = root / "torch-only"
    folder.mkdir()
    (folder / "torch_task.py").write_text(TORCH_TASK)
    spec = (root / "study" / "spec.toml").read_text()
    spec = spec.replace('"study_task:build"', '"torch_task:build"').replace(
        '"task.hidden" = 16\n', "").replace('metric = "val/accuracy"', 'metric = "val/mse"')
    (folder / "spec.toml").write_text(spec.replace('mode = "max"', 'mode = "min"'))
    return folder


def _launch_figures(root: Path, env: dict[str, str]) -> tuple[float, float]:
    """One ``launch --workers 2`` of the skeleton's other variant: seconds from the command's
    start to its first update, and the longest gap between two runs on one worker."""
    import time

    from campaign.ledger import Ledger

    folder = root / "study"
    url = f"sqlite:///{folder / 'campaign.db'}"
    started = time.time()
    subprocess.run([*_campaign(), "launch", "study", "--workers", "2"], cwd=folder, check=True,
                   env={**env, "CAMPAIGN_LEDGER": url}, capture_output=True)
    with Ledger.open(url) as ledger:
        runs = ledger.runs("study")
        launched = runs[runs["variant"] == "lr-3e-2"]
        metrics = ledger.metrics(runs=list(launched["run_id"]), keys=["train/loss"])
    first = float(metrics["wall_time"].min()) - started
    gaps = []
    for _, mine in launched.groupby("worker"):
        ordered = mine.sort_values("started_at")
        ends, starts = ordered["ended_at"].iloc[:-1], ordered["started_at"].iloc[1:]
        gaps += [(s - e).total_seconds() for e, s in zip(ends, starts, strict=True)]
    return first, max(gaps, default=0.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--host-rounds", type=int, default=5,
                        help="Rounds of the commands that start a task host (seconds each).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        cwd = Path(folder)
        env = {**os.environ, "CAMPAIGN_LEDGER": f"sqlite:///{cwd / 'ledger.db'}"}
        campaign = _campaign()
        subprocess.run([*campaign, "plan", str(ROOT / "examples" / "digits-lr.toml")],
                       env=env, cwd=cwd, check=True, capture_output=True)
        name = "digits-lr"
        approaches = {
            "import click": [sys.executable, "-c", "import click"],
            "import sqlalchemy": [sys.executable, "-c", "import sqlalchemy"],
            "campaign --help": [*campaign, "--help"],
            "campaign status": [*campaign, "status", name],
            "campaign runs": [*campaign, "runs", name],
        }
        medians = interleaved(
            {label: _runner(command, env, cwd) for label, command in approaches.items()},
            args.rounds,
        )
        skeleton, runs = _skeleton(cwd, env, args.host_rounds)
        skeleton_env = {**env, "CAMPAIGN_LEDGER": f"sqlite:///{skeleton / 'campaign.db'}"}
        queue = list(runs)
        hosted = {
            "import torch": [sys.executable, "-c", "import torch"],
            "import torch; import study_task": [sys.executable, "-c",
                                                "import torch; import study_task"],
            "campaign plan --dry-run": [*campaign, "plan", "spec.toml", "--dry-run"],
            "bare_run.py (100 updates)": [sys.executable, str(ROOT / "benchmarks" /
                                                              "bare_run.py"), str(skeleton)],
        }
        rounds = {label: _runner(command, skeleton_env, skeleton)
                  for label, command in hosted.items()}
        plain = _torch_only(cwd)
        plain_env = {**env, "CAMPAIGN_LEDGER": f"sqlite:///{plain / 'campaign.db'}"}
        rounds["import torch, torch_task"] = _runner(
            [sys.executable, "-c", "import torch, torch_task"], plain_env, plain)
        rounds["campaign plan --dry-run (torch only)"] = _runner(
            [*campaign, "plan", "spec.toml", "--dry-run"], plain_env, plain)
        rounds["campaign run (100 updates)"] = lambda: subprocess.run(
            [*campaign, "run", queue.pop(0)], env=skeleton_env, cwd=skeleton, check=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        medians |= interleaved(rounds, args.host_rounds)
        first, gap = _launch_figures(cwd, env)
        medians["launch: first update"] = first
    print(f"\nfresh processes, median of {args.rounds} interleaved rounds "
          f"({args.host_rounds} for the task-host commands)")
    failed = False
    for label, seconds in medians.items():
        line = f"  {label:<34} {seconds * 1000:8.1f} ms"
        if label in LIMITS:
            yardstick, limit = LIMITS[label]
            ratio = seconds / medians[yardstick]
            verdict = "ok" if ratio <= limit else "OVER"
            failed |= ratio > limit
            line += f"  {ratio:5.2f}x {yardstick} (limit {limit}x: {verdict})"
        print(line)
    verdict = "ok" if gap <= GAP_LIMIT_S else "OVER"
    failed |= gap > GAP_LIMIT_S
    print(f"  {'launch: gap between runs':<20} {gap * 1000:8.1f} ms  (limit "
          f"{GAP_LIMIT_S * 1000:g} ms: {verdict})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
