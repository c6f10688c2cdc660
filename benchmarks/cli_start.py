"""Command-line start-up: a command that does not train answers about as fast as Python can
import its libraries.

    python benchmarks/cli_start.py [--rounds 15]

Each command is a fresh process (what a user waits for), run interleaved with
its yardstick round by round; medians and ratios are printed:

- ``campaign --help`` against ``python -c "import click"``: at most 2x;
- ``campaign status C`` and ``campaign runs C`` against
  ``python -c "import sqlalchemy"``: at most 2.5x each.

The campaign is planned once from ``examples/digits-lr.toml`` into a temporary
SQLite ledger (12 runs).
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
          "campaign runs": ("import sqlalchemy", 2.5)}  # fmt: skip


def _campaign() -> list[str]:
    """The console script as users run it (``python -m campaign`` when it is not on PATH)."""
    script = shutil.which("campaign", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "campaign"]


def _runner(command: list[str], env: dict[str, str], cwd: Path) -> object:
    def run() -> None:
        subprocess.run(command, env=env, cwd=cwd, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        cwd = Path(folder)
        env = {**os.environ, "CAMPAIGN_LEDGER": f"sqlite:///{cwd / 'ledger.db'}"}
        campaign = _campaign()
        subprocess.run([*campaign, "plan", str(ROOT / "examples" / "digits-lr.toml")],
                       env=env, cwd=cwd, check=True, capture_output=True)  # fmt: skip
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
    print(f"\nfresh processes, median of {args.rounds} interleaved rounds")
    failed = False
    for label, seconds in medians.items():
        line = f"  {label:<20} {seconds * 1000:8.1f} ms"
        if label in LIMITS:
            yardstick, limit = LIMITS[label]
            ratio = seconds / medians[yardstick]
            verdict = "ok" if ratio <= limit else "OVER"
            failed |= ratio > limit
            line += f"  {ratio:5.2f}x {yardstick} (limit {limit}x: {verdict})"
        print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
