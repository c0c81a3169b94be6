"""The package's layering (issue 13): the engine imports no UI and no pydantic, and no module imports in a cycle.

The import graph is read from the source with `ast` — every import, function-level and TYPE_CHECKING ones
included, relative ones resolved — so a lazy import cannot hide a cycle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import localspec

PACKAGE_DIR = Path(localspec.__file__).parent
ENGINE_LAYER = ("localspec.engine", "localspec.sampling", "localspec.verify", "localspec.kv", "localspec.backend")
ABOVE_ENGINE = ("localspec.tui", "localspec.cli", "localspec.config", "localspec.flags", "localspec.runner")


def module_files(root: Path = PACKAGE_DIR, package: str = "localspec") -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its __init__)."""
    modules = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join([package, *parts])] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module `name` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".")
                base_parts = parts if is_package else parts[:-1]
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # `from X import y` imports the submodule X.y when there is one, else a name of X
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import localspec.tui.app` names the module itself
                target = target.rpartition(".")[0] if "." in target and target.startswith("localspec.") else ""
            if target and target != name:
                found.add(target)
    return found


def import_graph(root: Path = PACKAGE_DIR, package: str = "localspec") -> dict[str, set[str]]:
    modules = module_files(root, package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_graph_reader_sees_relative_and_function_level_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .. import a\n")
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.a"]
    assert find_cycle({"x": {"y"}, "y": set()}) is None


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert "localspec.tui.loading" in graph and "localspec.runner" in graph["localspec.tui.loading"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("module", ENGINE_LAYER)
def test_the_engine_layer_imports_nothing_above_it(module):
    above = {m for m in reachable(import_graph(), module) if m.startswith(ABOVE_ENGINE)}
    assert not above, f"{module} imports {sorted(above)}"


def test_the_chat_app_does_not_import_the_cli():
    graph = import_graph()
    tui = {m for m in graph if m.startswith("localspec.tui")}
    assert not {m for m in tui if "localspec.cli" in reachable(graph, m)}


def test_importing_the_engine_loads_no_ui_and_no_pydantic():
    code = (
        "import sys, localspec.engine, localspec.params\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'pydantic', 'rich'))\n"
        "print(' '.join(bad))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "", f"importing the engine loaded {result.stdout.strip()}"
