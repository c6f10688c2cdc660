"""The layers of docs/architecture.md and the house rules, checked on the code itself.

The import graph is built with ``ast`` from every module of ``campaign/``,
imports inside functions included (a cycle hidden in a function is still a
cycle) and ``if TYPE_CHECKING:`` blocks excluded (they never run). A name
imported from a package is resolved to the module that defines it, so lazy
package ``__init__`` files do not hide an edge.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "campaign"
MAX_LINES = 500


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


# The layers, lowest first (docs/architecture.md, "Layers"): each package and what it may
# import of ours besides itself. One table, no per-file exception; imports inside functions
# count. A top-level module of campaign/ is its own entry.
BELOW_LOOP = ("campaign.errors", "campaign.ledger", "campaign.stack", "campaign.host")
LAYERS: dict[str, tuple[str, ...]] = {
    "campaign.errors": (),
    # paired statistics: intervals, tests, Holm (the report's and a search's)
    "campaign.stats": (),
    "campaign.ledger": ("campaign.errors",),
    # the Alembic environment: the ledger's engines and tables (revisions import nothing of ours)
    "campaign.migrations": ("campaign.errors", "campaign.ledger"),
    "campaign.stack": ("campaign.errors",),
    "campaign.host": ("campaign.errors",),
    "campaign.loop": BELOW_LOOP,
    "campaign.tasks": ("campaign.errors", "campaign.stack", "campaign.loop"),
    "campaign.plan": (*BELOW_LOOP, "campaign.loop"),
    "campaign.gates": (*BELOW_LOOP, "campaign.loop", "campaign.plan"),
    # a search's decisions, from the ledger alone (its runs are placed by launch/)
    "campaign.search": (*BELOW_LOOP, "campaign.stats", "campaign.loop", "campaign.plan"),
    "campaign.report": ("campaign.errors", "campaign.stats", "campaign.ledger", "campaign.stack",
                        "campaign.plan", "campaign.gates", "campaign.search"),
    "campaign.pilot": (*BELOW_LOOP, "campaign.loop", "campaign.tasks", "campaign.plan",
                       "campaign.gates"),
    # pilot: only a gate class a search proposed, in a host child (launch/search_work.py)
    "campaign.launch": (*BELOW_LOOP, "campaign.loop", "campaign.plan", "campaign.gates",
                        "campaign.search", "campaign.pilot"),
    "campaign.reproduce": ("campaign.errors", "campaign.ledger", "campaign.stack"),
    # the dashboard reads the ledger and the report's tables; it starts nothing
    "campaign.serve": ("campaign.errors", "campaign.ledger", "campaign.plan", "campaign.report"),
    "campaign.notebook": ("campaign.ledger", "campaign.report"),
    "campaign.demo_llm": ("campaign.tasks",),
    "campaign.demo": (*BELOW_LOOP, "campaign.loop", "campaign.plan", "campaign.gates",
                      "campaign.report", "campaign.pilot", "campaign.launch", "campaign.demo_llm"),
    "campaign.cli": (*BELOW_LOOP, "campaign.stats", "campaign.loop", "campaign.tasks",
                     "campaign.plan", "campaign.gates", "campaign.search", "campaign.report",
                     "campaign.pilot", "campaign.launch",
                     "campaign.reproduce", "campaign.serve", "campaign.demo"),
    "campaign.__main__": ("campaign.cli",),
    # the package's own names for notebooks and tasks (Ledger, Task), loaded on first use
    "campaign": ("campaign.loop", "campaign.notebook"),
}


def layer_of(module: str) -> str:
    """The table's entry a module belongs to: its package under campaign/, or itself."""
    parts = module.split(".")
    return module if len(parts) == 1 else ".".join(parts[:2])


def against_the_layers(graph: dict[str, set[str]]) -> list[str]:
    """Every import the table does not allow, as ``importer -> imported``."""
    wrong = []
    for name, targets in sorted(graph.items()):
        mine = layer_of(name)
        allowed = {mine, *LAYERS[mine]}
        wrong += [f"{name} -> {t}" for t in sorted(targets) if layer_of(t) not in allowed]
    return wrong


def test_every_module_has_a_layer(graph: dict[str, set[str]]) -> None:
    assert sorted({layer_of(n) for n in graph} - set(LAYERS)) == []


def test_imports_follow_the_layer_table(graph: dict[str, set[str]]) -> None:
    assert against_the_layers(graph) == []


def test_the_table_points_one_way() -> None:
    """The table itself has no loop: each layer may import only layers listed before it."""
    order = list(LAYERS)
    for layer, allowed in LAYERS.items():
        later = [a for a in allowed if order.index(a) >= order.index(layer)]
        assert later == [] or layer == "campaign", (layer, later)


def test_the_checker_sees_an_import_against_the_layers() -> None:
    """The checker itself: a loop module importing the launcher (in a function) is caught."""
    graph = {"campaign.loop.train": {"campaign.launch.worker", "campaign.ledger.store"},
             "campaign.launch.worker": set(), "campaign.ledger.store": set()}
    assert against_the_layers(graph) == ["campaign.loop.train -> campaign.launch.worker"]


def test_module_names_are_unique() -> None:
    """A module's name says its one job: no two modules share one (``cli/`` modules are named
    after their command group and exempt only from sharing with the library's)."""
    seen: dict[str, list[str]] = {}
    for name in MODULES:
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in ("__init__", "__main__") and not name.startswith("campaign.cli."):
            seen.setdefault(leaf, []).append(name)
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}


def test_class_names_are_unique() -> None:
    """One class per name across the package: a reader who meets ``Host`` or ``Pilot`` knows
    which one it is."""
    seen: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                seen.setdefault(node.name, []).append(name)
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}


def test_no_module_over_500_lines() -> None:
    long = {n: len(p.read_text().splitlines()) for n, p in MODULES.items()}
    assert {n: c for n, c in long.items() if c > MAX_LINES} == {}
