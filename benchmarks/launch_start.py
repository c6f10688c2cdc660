"""How soon `campaign launch C --workers 2` trains: its first update against `import torch`.

    python benchmarks/launch_start.py [--rounds 5]

Each round plans a fresh copy of the ``campaign init`` skeleton (one seed: three runs of
100 updates, its pilot skipped with a reason; set-up not timed), then times, in a rotating
order, ``python -c "import torch"`` and the launch, both fresh processes. The launch's
figures come from the ledger's clock, counted from the command's start: the first run's
claim (``started_at``) and its first update (the first ``train/loss`` point's
``wall_time``). Medians and the ratio to the yardstick are printed (issue 24's limit for the
first update: 1.5x ``import torch``).
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

from cli_start import _campaign

LIMIT = 1.5


def _study(root: Path, env: dict[str, str]) -> tuple[Path, dict[str, str]]:
    campaign = _campaign()
    subprocess.run([*campaign, "init", "study"], env=env, cwd=root, check=True,
                   capture_output=True)  # fmt: skip
    folder = root / "study"
    spec = (folder / "spec.toml").read_text().replace("seeds = [0, 1, 2]", "seeds = [0]")
    (folder / "spec.toml").write_text(spec)
    mine = {**env, "CAMPAIGN_LEDGER": f"sqlite:///{folder / 'campaign.db'}"}
    subprocess.run([*campaign, "plan", "spec.toml"], env=mine, cwd=folder, check=True,
                   capture_output=True)  # fmt: skip
    return folder, mine


def _launch(folder: Path, env: dict[str, str]) -> tuple[float, float]:
    """Seconds from the command's start to the first claim and to the first update."""
    from campaign.ledger import Ledger

    started = time.time()
    subprocess.run([*_campaign(), "launch", "study", "--workers", "2", "--skip-pilot",
                    "--reason", "benchmark"], env=env, cwd=folder, check=True,
                   capture_output=True)  # fmt: skip
    with Ledger.open(env["CAMPAIGN_LEDGER"]) as ledger:
        runs = ledger.runs("study")
        points = ledger.metrics("study", keys=["train/loss"])
    claimed = min(t.timestamp() for t in runs["started_at"]) - started
    return claimed, float(points["wall_time"].min()) - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch_s: list[float] = []
    claims: list[float] = []
    firsts: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ}
        for index in range(args.rounds):
            root = Path(folder) / f"round-{index}"
            root.mkdir()
            study, study_env = _study(root, env)
            order = ["torch", "launch"] if index % 2 == 0 else ["launch", "torch"]
            for name in order:
                if name == "torch":
                    begun = time.perf_counter()
                    subprocess.run([sys.executable, "-c", "import torch"], check=True)
                    torch_s.append(time.perf_counter() - begun)
                else:
                    claimed, first = _launch(study, study_env)
                    claims.append(claimed)
                    firsts.append(first)
            print(f"round {index + 1}: import torch {torch_s[-1]:.2f} s, launch: first claim "
                  f"{claims[-1]:.2f} s, first update {firsts[-1]:.2f} s", flush=True)
    yardstick, first = statistics.median(torch_s), statistics.median(firsts)
    ratio = first / yardstick
    print(f"\nmedians of {args.rounds} interleaved rounds (fresh processes):")
    print(f"  python -c 'import torch'              {yardstick * 1000:8.0f} ms")
    print(f"  launch --workers 2: first claim       {statistics.median(claims) * 1000:8.0f} ms")
    print(f"  launch --workers 2: first update      {first * 1000:8.0f} ms  {ratio:.2f}x "
          f"import torch (limit {LIMIT}x: {'ok' if ratio <= LIMIT else 'OVER'})")
    return 0 if ratio <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
