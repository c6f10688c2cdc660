"""Fresh-process checks: a new interpreter each time against a fork of the preloaded one.

    python benchmarks/fresh_process.py [--rounds 7]

The check measured is the one every completed run pays: the final artifact of
a digits run reloaded and its control inputs replayed in a fresh process
(``python -m campaign.loop.replay PATH TASK``), answered as JSON. Both ways run
interleaved in one process; medians and their ratio are printed. The first
preloaded call (which starts the server: one interpreter and its imports) is
timed apart, since a worker pays it once for all its runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from common import interleaved

from campaign.loop import fresh_process
from campaign.loop.replay import write_final
from campaign.tasks.digits import build

TASK = "campaign.tasks.digits:build"


def _artifact(folder: Path) -> Path:
    import torch

    config = {"task": {"hidden": 64}, "seed": 0}
    task = build(config)
    path = folder / "final.safetensors"
    write_final(path, task.model(), task, "{}", "{}", torch.device("cpu"))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = _artifact(Path(folder))
        arguments = ["-m", "campaign.loop.replay", str(path), TASK]

        def replay(mode: str) -> None:
            os.environ[fresh_process.MODE_VARIABLE] = mode
            assert fresh_process.run_json(arguments)["identical"]

        began = time.perf_counter()
        replay("preloaded")
        first = time.perf_counter() - began
        medians = interleaved(
            {"new interpreter": lambda: replay("spawn"),
             "fork of the preloaded": lambda: replay("preloaded")},
            args.rounds,
        )  # fmt: skip
    print(f"\nreplay of a final artifact in a fresh process, median of {args.rounds} rounds")
    print(f"  first preloaded call (starts the server)  {first * 1000:8.1f} ms")
    for label, seconds in medians.items():
        print(f"  {label:<40} {seconds * 1000:8.1f} ms")
    ratio = medians["new interpreter"] / medians["fork of the preloaded"]
    print(f"  a fork of the preloaded interpreter is {ratio:.1f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
