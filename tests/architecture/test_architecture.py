"""The house rules of DESIGN.md §9 and §11, checked on the code itself.

The import graph is built with ``ast`` from every module of ``campaign/``,
imports inside functions included (a cycle hidden in a function is still a
cycle) and ``if TYPE_CHECKING:`` blocks excluded (they never run). A name
imported from a package is resolved to the module that defines it, so lazy
package ``__init__`` files do not hide an edge.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from campaign.cli import main

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "campaign"
MAX_LINES = 500
SPEC = ROOT / "examples" / "digits-lr.toml"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: TYPE_CHECKING blocks are skipped."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (i for n in node.orelse for i in _runtime_imports_of(n))
            continue
        yield from _runtime_imports_of(node)


def _runtime_imports_of(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
        return
    yield from _runtime_imports(node)


def _target(module: str, name: str | None) -> str | None:
    """The campaign module an import reaches: a submodule, or the module defining ``name``."""
    if not module.startswith("campaign"):
        return None
    if name is None:
        return module
    if f"{module}.{name}" in MODULES:
        return f"{module}.{name}"
    defined = getattr(importlib.import_module(module), name, None)
    origin = getattr(defined, "__module__", None)
    return origin if origin in MODULES else module


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        for node in _runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [_target(alias.name, None) for alias in node.names]
            else:
                assert node.level == 0, f"{name}: relative import"
                targets = [_target(node.module or "", alias.name) for alias in node.names]
            graph[name].update(t for t in targets if t is not None and t != name)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as a path that returns to its start, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_no_import_cycle(graph: dict[str, set[str]]) -> None:
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_checker_sees_a_cycle_hidden_in_a_function() -> None:
    """The checker itself: a function-level import that closes a loop is found."""
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    tree = ast.parse("def f():\n    from campaign.ledger import store\n")
    assert [n.module for n in _runtime_imports(tree)] == ["campaign.ledger"]
    hidden = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\n")
    assert [getattr(n, "module", None) for n in _runtime_imports(hidden)] == ["typing"]


def _reaches(graph: dict[str, set[str]], source: str, prefixes: tuple[str, ...]) -> list[str]:
    return sorted(t for t in graph[source] if t.startswith(prefixes))


def test_the_ledger_imports_nothing_else_of_ours(graph: dict[str, set[str]]) -> None:
    for name in graph:
        if name.startswith("campaign.ledger"):
            others = [t for t in graph[name] if not t.startswith("campaign.ledger")]
            assert others == [], f"{name} imports {others}"


def test_imports_point_one_way(graph: dict[str, set[str]]) -> None:
    """cli -> plan / pilot / launch / report -> loop -> ledger (DESIGN.md §9)."""
    upper = ("campaign.cli", "campaign.launch", "campaign.pilot", "campaign.report",
             "campaign.plan.grid", "campaign.demo", "campaign.gates.doctor")
    rules = {
        "campaign.loop": upper,
        "campaign.report": ("campaign.cli", "campaign.launch", "campaign.pilot", "campaign.loop",
                            "campaign.serve"),
        # The dashboard reads: the ledger, the report's tables, the progress arithmetic.
        "campaign.serve": ("campaign.cli", "campaign.pilot", "campaign.loop", "campaign.plan.grid",
                           "campaign.demo"),
        "campaign.pilot": ("campaign.cli", "campaign.launch", "campaign.report"),
        "campaign.launch": ("campaign.cli", "campaign.report"),
        "campaign.tasks": (*upper, "campaign.ledger"),
        "campaign.stack.software": (*upper, "campaign.loop", "campaign.ledger"),
        # The task host knows only how to fork and report: no command, no placement, no run.
        "campaign.host": (*upper, "campaign.plan", "campaign.gates", "campaign.serve",
                          "campaign.ledger", "campaign.tasks"),
        "campaign.plan": ("campaign.cli", "campaign.launch", "campaign.pilot", "campaign.report",
                          "campaign.serve", "campaign.demo"),
        "campaign.gates": ("campaign.cli", "campaign.report", "campaign.serve", "campaign.demo"),
    }
    for name in graph:
        for package, forbidden in rules.items():
            if name == package or name.startswith(package + "."):
                assert _reaches(graph, name, forbidden) == [], name
    users_of_cli = [
        n for n in graph
        if not n.startswith("campaign.cli") and _reaches(graph, n, ("campaign.cli",))
    ]
    assert users_of_cli == ["campaign.__main__"]


def test_no_module_over_500_lines() -> None:
    long = {n: len(p.read_text().splitlines()) for n, p in MODULES.items()}
    assert {n: c for n, c in long.items() if c > MAX_LINES} == {}


# -- the command line answers without torch ------------------------------------------

READING_COMMANDS = [
    ["--help"],
    ["campaigns"],
    ["show", "digits-lr"],
    ["runs", "digits-lr", "--format", "json"],
    ["status", "digits-lr", "--format", "json"],
    ["notes", "digits-lr"],
    ["report", "digits-lr", "--format", "json", "--output", "-"],
    ["db", "current"],
    ["tensorboard", "digits-lr", "--logdir", "tb"],
]

PROBE = """
import json, sys
from campaign.cli import main
try:
    main(sys.argv[1:], prog_name="campaign")
except SystemExit as done:
    code = done.code
print(json.dumps({"torch": "torch" in sys.modules, "code": code}), file=sys.stderr)
"""


@pytest.mark.parametrize("arguments", READING_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_reading_commands_never_import_torch(tmp_path: Path, arguments: list[str]) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    planned = CliRunner().invoke(main, ["--ledger", url, "plan", str(SPEC)])
    assert planned.exit_code == 0, planned.output
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "--ledger", url, *arguments],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    verdict = json.loads(done.stderr.strip().splitlines()[-1])
    assert verdict["code"] in (0, None), done.stderr
    assert verdict["torch"] is False, f"`campaign {' '.join(arguments)}` imported torch"


def test_the_dashboard_renders_without_torch(tmp_path: Path) -> None:
    """`campaign serve` reads and renders every page kind without importing torch or
    matplotlib (its curves are drawn in the browser)."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    planned = CliRunner().invoke(main, ["--ledger", url, "plan", str(SPEC)])
    assert planned.exit_code == 0, planned.output
    probe = (
        "import sys, json\n"
        "from campaign.ledger import LedgerReader\n"
        "from campaign.serve import pages\n"
        "from campaign.serve.watch import Watcher\n"
        f"reader = LedgerReader.open({url!r})\n"
        "pages.campaigns_page(reader); pages.campaign_page(Watcher(reader), 'digits-lr')\n"
        "run = reader.runs('digits-lr')['run_id'][0]\n"
        "pages.run_page(reader, run); Watcher(reader).poll('digits-lr', None, None)\n"
        "print(json.dumps(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
