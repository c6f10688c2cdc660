"""When the fork server starts: as a command begins (``forkserver.start_early``) against when
its first child is needed (the fork server's imports then follow the command's own).

    python benchmarks/fork_server_start.py [--rounds 3]

Both approaches are fresh ``campaign`` processes of the ``campaign init`` skeleton, run
interleaved round by round; the "late" one replaces ``start_early`` with a no-op before the
command runs. Two commands a user waits for:

- ``campaign plan spec.toml --dry-run`` (its task checks run in fork-server children);
- ``campaign run RUN_ID --skip-pilot`` of a 100-update run (the run's process is forked
  from the fork server; the final artifact is replayed in a fresh process as always).

Medians and the ratio late / early are printed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import interleaved

COMMAND = """
import sys
import campaign.loop.forkserver as forkserver
if sys.argv[1] == "late":
    forkserver.start_early = lambda: None
from campaign.cli import main
sys.argv = ["campaign", *sys.argv[2:]]
main()
"""


def _campaign(when: str, *args: str, cwd: Path) -> None:
    done = subprocess.run([sys.executable, "-c", COMMAND, when, *args], cwd=cwd,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"benchmark: campaign {' '.join(args)} failed: {done.stderr[-500:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        subprocess.run([sys.executable, "-m", "campaign", "init", "study"], cwd=root,
                       check=True, capture_output=True)  # fmt: skip
        study, ledger = root / "study", f"sqlite:///{root / 'campaign.db'}"
        spec = study / "spec.toml"
        spec.write_text(spec.read_text().replace("seeds = [0, 1, 2]",
                                                 f"seeds = {list(range(rounds))}"))
        planned = subprocess.run([sys.executable, "-m", "campaign", "--ledger", ledger, "plan",
                                  "spec.toml", "--format", "json"], cwd=study, check=True,
                                 capture_output=True, text=True)  # fmt: skip
        run_ids = iter(run["run_id"] for run in json.loads(planned.stdout)["runs"])

        def plan(when: str) -> None:
            _campaign(when, "--ledger", f"sqlite:///{root / when}.db", "plan", "spec.toml",
                      "--dry-run", cwd=study)  # fmt: skip

        def run(when: str) -> None:
            _campaign(when, "--ledger", ledger, "run", next(run_ids), "--skip-pilot",
                      "--reason", "benchmark", "--artifacts", str(root / "art"), cwd=study)

        for name, command in (("plan --dry-run", plan), ("run (100 updates)", run)):
            medians = interleaved({"early": lambda c=command: c("early"),
                                   "late": lambda c=command: c("late")}, rounds)  # fmt: skip
            print(f"campaign {name}: fork server started early {medians['early']:.2f} s, "
                  f"when first needed {medians['late']:.2f} s: "
                  f"{medians['late'] / medians['early']:.2f}x")


if __name__ == "__main__":
    main()
