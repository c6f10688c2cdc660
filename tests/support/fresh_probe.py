"""Run by the fresh-process tests: answers with what a fresh process sees, then exits as asked."""

from __future__ import annotations

import json
import os
import sys

import tests.support.fresh_state as state


def imported_at_start(names: list[str]) -> dict[str, bool]:
    """Which of ``names`` a host's child has imported before it does anything (a call)."""
    return {name: name in sys.modules for name in names}

if __name__ == "__main__":
    print(json.dumps({
        "pid": os.getpid(), "cwd": os.getcwd(), "argv": sys.argv[1:],
        "variable": os.environ.get("PROBE_VARIABLE"), "counter": state.COUNTER,
        "torch_loaded": "torch" in sys.modules, "server": os.getppid(),
        "json_tool_loaded": "json.tool" in sys.modules,
    }))
    if "--fail" in sys.argv:
        print("first line\nthe reason it failed", file=sys.stderr)
        sys.exit(3)
