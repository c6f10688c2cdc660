"""CPU seconds per test, counting every process a test starts: where the suite's time goes.

    PYTHONPATH=$PWD/benchmarks make test PYTEST_ADDOPTS="-p suite_cpu"  # /tmp/suite-cpu-PID.tsv
    python benchmarks/suite_cpu.py /tmp/suite-cpu-*.tsv [--top 30]  # by test, then by file

On a 2-core machine the suite is CPU-bound, so wall times from ``--durations`` mostly say
which tests ran beside heavy ones; this counts what each test costs. As a pytest plugin it
reads, before and after each test, the CPU time of the test process and of all its
descendants (``/proc``: a live process's own and its reaped children's time, so a process
that ended inside the test is counted through its parent). Processes a test leaves to init
(a Ray or SLURM daemon) are not counted. ``SUITE_CPU_OUT`` sets the files' prefix.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK")
PREFIX = os.environ.get("SUITE_CPU_OUT", "/tmp/suite-cpu")


def _children() -> dict[int, list[tuple[int, float]]]:
    """ppid -> [(pid, its CPU seconds and its reaped children's)] for every process."""
    found: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after the name: state ppid ... utime(12) stime(13) cutime(14) cstime(15), 1-based
        found[int(fields[1])].append((int(name), sum(int(x) for x in fields[11:15]) / TICKS))
    return found


def tree_cpu() -> float:
    """CPU seconds of this process, its reaped children and every live descendant."""
    mine = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = mine.ru_utime + mine.ru_stime + reaped.ru_utime + reaped.ru_stime
    children, stack = _children(), [os.getpid()]
    while stack:
        for pid, seconds in children.get(stack.pop(), ()):
            total += seconds
            stack.append(pid)
    return total


try:
    import pytest
except ImportError:  # the summary below needs no pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: Any, nextitem: Any) -> Any:
        cpu, wall = tree_cpu(), time.monotonic()
        yield
        cpu, wall = tree_cpu() - cpu, time.monotonic() - wall
        with open(f"{PREFIX}-{os.getpid()}.tsv", "a") as out:
            out.write(f"{cpu:.2f}\t{wall:.2f}\t{item.nodeid}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description="the slowest tests and files by CPU seconds")
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)} (run the suite with -p suite_cpu)")
    rows = [line.split("\t") for file in args.files for line in file.read_text().splitlines()]
    tests = sorted(((float(c), float(w), n) for c, w, n in rows), reverse=True)
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for cpu, wall, name in tests:
        files[name.split("::")[0]][0] += cpu
        files[name.split("::")[0]][1] += wall
    total = sum(c for c, _, _ in tests)
    print(f"{len(tests)} tests, {total:.0f} CPU-s in all (their wall times add up to "
          f"{sum(w for _, w, _ in tests):.0f} s over the workers)\n\n  CPU-s   wall-s  test")
    for cpu, wall, name in tests[: args.top]:
        print(f"{cpu:7.1f}  {wall:7.1f}  {name}")
    print("\n  CPU-s   wall-s  file")
    for name, (cpu, wall) in sorted(files.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{cpu:7.1f}  {wall:7.1f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
