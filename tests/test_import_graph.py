"""The project's import graph: no cycles, no upward arrows, no private names borrowed across modules.

The graph is read from the source (every import statement, also those inside functions, which a runtime
import would only meet when the function runs), so a cycle that only closes at run time is caught too.
Imports under `if TYPE_CHECKING:` are left out: they never execute. A second test imports every module in
a fresh interpreter, in alphabetical and in reverse order, as the real check that each one imports alone."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("datamodules", "modules", "harness")

FLOORS = [
    ("datamodules",),
    ("modules",),
    ("harness",),
    ("harness.plan",),
    ("harness.results",),
    ("harness.run",),
    ("harness.report",),
    ("harness.studies",),
    ("harness.bench", "harness.cli", "harness.commands", "harness.__main__"),
]
"""Bottom first: a module may import its own floor and the floors below it, never one above. The data
floor knows no models, models know no harness, and in the harness data flows plan -> run -> results ->
report (run writes results, so results sits below run; report reads both plan and results). The command
line (harness/cli.py and its verbs in harness/commands/) sits on top."""


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")}


def floor(name: str) -> int:
    best, level = -1, -1
    for index, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), index
    return level


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING" or \
        isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING"


def imports(name: str) -> list[tuple[str, list[str]]]:
    """(imported project module, names taken from it) for every executable import statement of `name`."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.append((submodule, []) if submodule in MODULES else (base, [alias.name]))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return [(target, names) for target, names in found if target.split(".")[0] in PACKAGES and target in MODULES]


GRAPH = {name: imports(name) for name in sorted(MODULES)}


def test_the_graph_sees_the_project():
    assert {"harness.cli", "harness.commands.run", "harness.plan.planner", "harness.results.store", "datamodules.image_features"} <= set(MODULES)
    assert ("harness.results.record", ["Record"]) in GRAPH["harness.results.store"] or \
        any(t == "harness.results.record" for t, _ in GRAPH["harness.results.store"])


def test_no_import_cycles():
    edges = {name: {t for t, _ in targets if t != name} for name, targets in GRAPH.items()}
    cycles, state = [], {}

    def walk(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for target in sorted(edges[node]):
            if state.get(target) == "open":
                cycles.append(stack[stack.index(target):] + [target] if target in stack else [node, target])
            elif target not in state:
                walk(target, stack + [target])
        state[node] = "done"

    for name in sorted(edges):
        if name not in state:
            walk(name, [name])
    # A package's __init__ importing its own submodules, which import their package back, is how Python
    # packages re-export; only cycles through two or more non-__init__ modules are real.
    real = [c for c in cycles if sum(1 for m in set(c) if MODULES[m].name != "__init__.py") >= 2]
    assert not real, "import cycles:\n" + "\n".join(" -> ".join(c) for c in real)


def test_no_upward_arrows():
    upward = [f"{name} (floor {floor(name)}) imports {target} (floor {floor(target)})"
              for name, targets in GRAPH.items() for target, _ in targets if floor(target) > floor(name)]
    assert not upward, "\n".join(upward)


def test_the_harness_borrows_no_private_names():
    borrowed = [f"{name} imports {target}.{n}" for name, targets in GRAPH.items() if name.startswith("harness")
                for target, names in targets for n in names if n.startswith("_") and target != name]
    assert not borrowed, "\n".join(borrowed)


@pytest.mark.parametrize("order", ["alphabetical", "reverse"])
def test_every_module_imports_in_a_fresh_interpreter(order):
    names = sorted(MODULES, reverse=order == "reverse")
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    done = subprocess.run([sys.executable, "-c", code, *names], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
