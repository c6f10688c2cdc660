"""How soon `campaign launch C --workers 2` trains: its first update against `import torch`.

    python benchmarks/launch_start.py [--rounds 5]

Each round plans a fresh copy of the ``campaign init`` skeleton (one seed: three runs of
100 updates, its pilot skipped with a reason; set-up not timed), then times, in a rotating
order, ``python -c "import torch"`` and the launch, both fresh processes. The launch's
figures come from the ledger's clock, counted from the command's start: the first run's
claim (``started_at``) and its first update (the first ``train/loss`` point's
``wall_time``). Medians and the ratio to the yardstick are printed (issue 24's limit for the
first update: 1.5x ``import torch``). The floor is timed in the same rounds:
``bare_run.py STUDY 1``, one fresh process that imports torch and the skeleton's task and
trains one update by hand (AdamW's first step imports ``torch._dynamo``). No launcher reaches
its first update sooner: its ratio to ``import torch`` is what any launcher spends on this
machine before it adds anything, and the launch's ratio to it is what the launcher adds.
``--compare-with PYTHON`` times another checkout's
launch in the same rounds (its virtual environment's interpreter), e.g. the code before a
change.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LIMIT = 1.5
BARE_RUN = Path(__file__).with_name("bare_run.py")
YARDSTICKS = {  # each a fresh process, given the round's study folder
    "import torch": lambda _folder: [sys.executable, "-c", "import torch"],
    "bare first update": lambda folder: [sys.executable, str(BARE_RUN), str(folder), "1"],
}


def _command(python: str) -> list[str]:
    """``python``'s own console script (its checkout's code), else ``python -m campaign``."""
    script = Path(python).parent / "campaign"
    return [str(script)] if script.is_file() else [python, "-m", "campaign"]


def _study(root: Path, env: dict[str, str], campaign: list[str]) -> tuple[Path, dict[str, str]]:
    """The skeleton in ``root/study``, one seed, planned by ``campaign``; its folder and env."""
    subprocess.run([*campaign, "init", "study"], env=env, cwd=root, check=True,
                   capture_output=True)
    folder = root / "study"
    spec = (folder / "spec.toml").read_text().replace("seeds = [0, 1, 2]", "seeds = [0]")
    (folder / "spec.toml").write_text(spec)
    mine = {**env, "CAMPAIGN_LEDGER": f"sqlite:///{folder / 'campaign.db'}"}
    subprocess.run([*campaign, "plan", "spec.toml"], env=mine, cwd=folder, check=True,
                   capture_output=True)
    return folder, mine


def _launch(folder: Path, env: dict[str, str], campaign: list[str]) -> tuple[float, float]:
    """Seconds from the command's start to the first claim and to the first update."""
    from campaign.ledger import Ledger

    started = time.time()
    subprocess.run([*campaign, "launch", "study", "--workers", "2", "--skip-pilot",
                    "--reason", "benchmark"], env=env, cwd=folder, check=True,
                   capture_output=True)
    with Ledger.open(env["CAMPAIGN_LEDGER"]) as ledger:
        runs = ledger.runs("study")
        points = ledger.metrics("study", keys=["train/loss"])
    claimed = min(t.timestamp() for t in runs["started_at"]) - started
    return claimed, float(points["wall_time"].min()) - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compare-with", metavar="PYTHON",
                        help="another checkout's interpreter, its launch timed beside")
    args = parser.parse_args()
    if args.compare_with and not os.access(args.compare_with, os.X_OK):
        parser.error(f"--compare-with {args.compare_with}: not an executable Python")
    launches = {"this checkout": _command(sys.executable)}
    if args.compare_with:
        launches["compared"] = _command(args.compare_with)
    names = ["import torch", "bare first update", *launches]
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as folder:
        for index in range(args.rounds):
            studies = {}
            for name, campaign in launches.items():
                root = Path(folder) / f"{index}-{len(studies)}"
                root.mkdir()
                studies[name] = _study(root, dict(os.environ), campaign)
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                if name in YARDSTICKS:
                    begun = time.perf_counter()
                    subprocess.run(YARDSTICKS[name](studies["this checkout"][0]), check=True)
                    times[name].append((0.0, time.perf_counter() - begun))
                else:
                    times[name].append(_launch(*studies[name], launches[name]))
            print(f"round {index + 1}: " + ", ".join(
                f"{n} {times[n][-1][1]:.2f} s" for n in names), flush=True)
    yardstick = statistics.median(t for _, t in times["import torch"])
    floor = statistics.median(t for _, t in times["bare first update"])
    print(f"\nmedians of {args.rounds} interleaved rounds (fresh processes):")
    print(f"  python -c 'import torch'                        {yardstick * 1000:8.0f} ms")
    print(f"  bare_run.py STUDY 1 (the floor)                 {floor * 1000:8.0f} ms  "
          f"{floor / yardstick:.2f}x import torch")
    failed = False
    for name in launches:
        claim = statistics.median(c for c, _ in times[name])
        first = statistics.median(f for _, f in times[name])
        ratio = first / yardstick
        failed |= name == "this checkout" and ratio > LIMIT
        print(f"  {name}: launch --workers 2, first claim  {claim * 1000:8.0f} ms")
        print(f"  {name}: launch --workers 2, first update {first * 1000:8.0f} ms  "
              f"{ratio:.2f}x import torch (limit {LIMIT}x), {first / floor:.2f}x the floor")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
