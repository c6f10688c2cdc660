"""What a ledger that does not answer (a network cut, a lost machine) costs a training loop.

    python benchmarks/silent_ledger.py [--seconds 15] [--rounds 2]

A loop logs one point every 20 ms to a run's keep-going metric writer (flush every 0.25 s)
pointed at a listener that takes TCP connections and never answers, so each try to reach it
waits PostgreSQL's connect timeout (5 s). Two approaches, interleaved round by round:

- **probe** (as shipped, campaign/ledger/reach_probe.py): after the first failed try a thread
  asks the server; the loop tries again only once it answered;
- **loop tries**: the loop itself tries again at each flush past its backoff (0.25 s doubling
  to 5 s), as the writer did before the probe.

Printed: updates the loop made in the window, the share of the window spent inside ``log()``,
the longest single ``log()``; the first try (which waits the timeout in both) comes before
the window.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts the project on sys.path)

from campaign.ledger import metrics as metrics_module
from campaign.ledger.connections import create_ledger_engine, parse_url
from campaign.ledger.metrics import MetricWriter
from campaign.ledger.outage import riding_out

STEP_S = 0.02


class _LoopTries:
    """The writer's behaviour before the probe: always worth trying from the loop."""

    def went_away(self) -> None:
        pass

    def worth_trying(self) -> bool:
        return True


def one(url: str, seconds: float, probe: bool, folder: Path) -> dict[str, float]:
    shipped = metrics_module.probe_for
    if not probe:
        metrics_module.probe_for = lambda _engine: _LoopTries()  # type: ignore[assignment]
    try:
        engine = riding_out(create_ledger_engine(parse_url(url)))
        writer = MetricWriter(engine, "run", 1, interval_s=0.25,
                              spill=folder / f"spill-{probe}-{time.monotonic_ns()}")
        writer.log("train/loss", 0, 1.0)
        writer.flush()  # the first try: the connect timeout, in both approaches
        updates, inside, longest = 0, 0.0, 0.0
        began = time.monotonic()
        while time.monotonic() - began < seconds:
            updates += 1
            before = time.monotonic()
            writer.log("train/loss", updates, 1.0 / updates)
            took = time.monotonic() - before
            inside, longest = inside + took, max(longest, took)
            time.sleep(STEP_S)
        window = time.monotonic() - began
        engine.dispose()
        return {"updates": updates, "blocked": inside / window, "longest": longest}
    finally:
        metrics_module.probe_for = shipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    results: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    with socket.socket() as silent, tempfile.TemporaryDirectory() as folder:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1024)  # the kernel completes each handshake; nobody ever answers
        url = f"postgresql+psycopg://postgres@127.0.0.1:{silent.getsockname()[1]}/ledger"
        for _ in range(args.rounds):
            for probe in (True, False):
                results[probe].append(one(url, args.seconds, probe, Path(folder)))
    print(f"{args.seconds:g} s window, one point every {STEP_S * 1000:.0f} ms, "
          f"medians of {args.rounds} round(s)")
    print(f"{'approach':<12} {'updates':>8} {'in log()':>9} {'longest log()':>14}")
    medians = {}
    for probe, name in ((True, "probe"), (False, "loop tries")):
        rows = results[probe]
        medians[probe] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        m = medians[probe]
        print(f"{name:<12} {m['updates']:>8.0f} {m['blocked']:>8.0%} {m['longest']:>13.2f}s")
    ratio = medians[True]["updates"] / medians[False]["updates"]
    print(f"updates, probe / loop tries: {ratio:.1f}x")


if __name__ == "__main__":
    main()
