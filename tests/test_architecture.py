"""The package's layering, checked on the import graph: one test per rule, each also shown to fail.

The graph is read from the source with `ast` — every import, function-level and TYPE_CHECKING ones included,
relative ones resolved — so a lazy import cannot hide a cycle or a layer break. Each rule is a function that
returns its violations; the tests run it on the real package (no violation) and on a copy of the package with
one deliberately wrong import added (exactly that violation), so a rule that checks nothing fails here.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import localspec

PACKAGE_DIR = Path(localspec.__file__).parent

# Each layer (a folder, or a leaf module at the top) and the layers it may import besides itself.
LAYERS: dict[str, set[str]] = {
    "errors": set(),
    "paths": set(),
    "progress": set(),
    "llama": {"errors"},
    "core": {"llama", "errors"},
    "models": {"core", "llama", "errors", "paths", "progress"},
    "bench": {"core", "llama", "models", "errors", "paths", "progress"},
    "tui": {"core", "llama", "models", "errors", "paths"},
    "server": {"core", "llama", "models", "errors", "paths"},
    "cli": {"bench", "tui", "server", "core", "llama", "models", "errors", "paths", "progress"},
    "__main__": {"cli"},
}
NATIVE = "llama_cpp"  # llama-cpp-python: only `localspec.llama` may import it
TOP = {"core", "models", "errors"}  # what the package top (the public API, `localspec.__all__`) may import


def module_files(root: Path = PACKAGE_DIR, package: str = "localspec") -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its __init__)."""
    modules = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join([package, *parts])] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path], package: str) -> tuple[set[str], set[str]]:
    """(the package's modules that `name` imports, the top-level names of everything else it imports)."""
    is_package = path.name == "__init__.py"
    internal: set[str] = set()
    external: set[str] = set()
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
            if target.split(".")[0] != package:
                external.add(target.split(".")[0])
                continue
            while target not in modules:  # `import localspec.tui.app` names the module itself
                target = target.rpartition(".")[0]
            if target != name:
                internal.add(target)
    return internal, external


def import_graph(root: Path = PACKAGE_DIR, package: str = "localspec") -> dict[str, set[str]]:
    """Module → the package's modules it imports."""
    modules = module_files(root, package)
    return {name: imports_of(name, path, modules, package)[0] for name, path in modules.items()}


def external_imports(root: Path = PACKAGE_DIR, package: str = "localspec") -> dict[str, set[str]]:
    """Module → the top-level names of the other packages it imports."""
    modules = module_files(root, package)
    return {name: imports_of(name, path, modules, package)[1] for name, path in modules.items()}


def layer(module: str) -> str:
    """`localspec.core.engine` → "core"; `localspec.errors` → "errors"; the package itself → ""."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of nodes (first == last), or None."""
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


def layer_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph folded onto layers (an edge between two layers, never a layer to itself)."""
    folded: dict[str, set[str]] = {}
    for module, targets in graph.items():
        folded.setdefault(layer(module), set()).update(layer(t) for t in targets if layer(t) != layer(module))
    return folded


# --- the rules: each returns its violations ------------------------------------------------------------------


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Module cycles and layer cycles, one line each."""
    found = []
    for what, g in (("modules", graph), ("layers", layer_graph(graph))):
        if cycle := find_cycle(g):
            found.append(f"{what}: " + " -> ".join(cycle))
    return found


def imports_outside(graph: dict[str, set[str]], source: str, allowed: set[str]) -> list[str]:
    """Imports from layer `source` into a layer that is neither `source` nor in `allowed`."""
    return sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        if layer(m) == source
        for t in targets
        if layer(t) not in allowed | {source}
    )


def layer_breaks(graph: dict[str, set[str]]) -> list[str]:
    """Every import that `LAYERS` does not allow (and every module outside the known layers)."""
    found = [f"{m}: not in a known layer" for m in graph if layer(m) and layer(m) not in LAYERS]
    for source, allowed in LAYERS.items():
        found += imports_outside(graph, source, allowed)
    return found


def native_importers(external: dict[str, set[str]]) -> list[str]:
    """Modules outside `localspec.llama` that import llama-cpp-python."""
    return sorted(m for m, names in external.items() if NATIVE in names and layer(m) != "llama")


# --- the tests ------------------------------------------------------------------------------------------------


@pytest.fixture
def broken_copy(tmp_path):
    """A copy of the package, and a function that adds one import line to one of its modules."""
    root = tmp_path / "localspec"
    shutil.copytree(PACKAGE_DIR, root, ignore=shutil.ignore_patterns("__pycache__"))

    def add_import(module: str, line: str) -> Path:
        path = root.joinpath(*module.split(".")[1:]).with_suffix(".py")
        if not path.exists():
            path = path.with_suffix("") / "__init__.py"
        path.write_text(path.read_text(encoding="utf-8") + f"\n\ndef _wrong():\n    {line}\n", encoding="utf-8")
        return root

    return add_import


def test_the_graph_reader_sees_relative_and_function_level_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import numpy.linalg\n\ndef f():\n    from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .. import a\n")
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert external_imports(pkg, "pkg")["pkg.a"] == {"numpy"}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.a"]
    assert find_cycle({"x": {"y"}, "y": set()}) is None


@pytest.mark.slow
def test_no_module_or_layer_imports_in_a_cycle(broken_copy):
    assert cycles(import_graph()) == []
    # kv imports nothing of the engine; engine imports kv: one more import closes a loop
    root = broken_copy("localspec.core.kv", "from localspec.core import engine")
    assert any("localspec.core.engine" in line for line in cycles(import_graph(root)))
    root = broken_copy("localspec.llama.model", "from localspec.core import sampling")
    assert "layers: core -> llama -> core" in cycles(import_graph(root))


def test_core_imports_only_core_llama_and_errors(broken_copy):
    assert imports_outside(import_graph(), "core", {"llama", "errors"}) == []
    root = broken_copy("localspec.core.sampling", "from localspec.paths import get_paths")
    assert imports_outside(import_graph(root), "core", {"llama", "errors"}) == [
        "localspec.core.sampling -> localspec.paths"
    ]


@pytest.mark.slow
def test_only_the_llama_layer_imports_llama_cpp(broken_copy):
    importers = {m for m, names in external_imports().items() if NATIVE in names}
    assert importers and all(layer(m) == "llama" for m in importers)  # the rule below sees real imports
    assert native_importers(external_imports()) == []
    root = broken_copy("localspec.core.engine", "import llama_cpp")
    assert native_importers(external_imports(root)) == ["localspec.core.engine"]


def test_the_chat_app_never_imports_the_cli(broken_copy):
    assert imports_outside(import_graph(), "tui", set(LAYERS) - {"cli"}) == []
    root = broken_copy("localspec.tui.widgets", "from localspec.cli.flags import add_model_args")
    assert imports_outside(import_graph(root), "tui", set(LAYERS) - {"cli"}) == [
        "localspec.tui.widgets -> localspec.cli.flags"
    ]


def test_every_layer_imports_only_the_layers_below_it(broken_copy):
    assert layer_breaks(import_graph()) == []
    root = broken_copy("localspec.models.pairs", "from localspec.bench import run")
    assert layer_breaks(import_graph(root)) == ["localspec.models.pairs -> localspec.bench.run"]


@pytest.mark.slow
def test_the_package_top_imports_only_core_models_and_errors(broken_copy):
    assert {layer(t) for t in import_graph()["localspec"]} == TOP  # the public API's imports are seen, lazy as they are
    assert imports_outside(import_graph(), "", TOP) == []
    root = broken_copy("localspec", "from localspec.tui import app")
    assert imports_outside(import_graph(root), "", TOP) == ["localspec -> localspec.tui.app"]


def test_the_package_docstring_names_every_layer():
    assert [name for name in LAYERS if f"`{name}`" not in localspec.__doc__] == []


def test_importing_the_engine_loads_no_ui_and_no_pydantic():
    code = (
        "import sys, localspec.core.engine, localspec.core.params\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'pydantic', 'rich'))\n"
        "print(' '.join(bad))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "", f"importing the engine loaded {result.stdout.strip()}"


def test_the_parameters_and_the_catalog_load_without_llama_cpp():
    code = "import sys, localspec.core.params, localspec.models.catalog\nprint('llama_cpp' in sys.modules)\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False", "validating models.toml loaded llama.cpp"


def test_whether_a_drafter_needs_the_draft_model_is_asked_one_way():
    """`params.needs_draft_model` is the question; the list it reads is read nowhere else (it was asked four ways)."""
    readers = sorted(
        name
        for name, path in module_files().items()
        if any(word in path.read_text(encoding="utf-8") for word in ("MODEL_DRAFTERS", "uses_draft_model"))
        and name != "localspec.core.params"
    )
    assert readers == []
