"""The public Python API (`localspec.__all__`): cheap to import, every name where it says, and the example of
docs/python-api.md runs as written.

The example runs in a child process on `chat_home`, whose "demo" pair is the tiny test pair: the real demo would
derive a 540 MB target first.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import localspec

ROOT = Path(__file__).resolve().parents[1]
API_PAGE = ROOT / "docs" / "python-api.md"
HEAVY = ("llama_cpp", "numpy", "textual", "pydantic", "rich")


def loaded_after(code: str) -> list[str]:
    """The heavy packages a fresh interpreter has imported after running `code`."""
    probe = f"import sys\n{code}\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    return result.stdout.split()


def test_importing_the_package_loads_neither_llama_cpp_nor_numpy_nor_textual():
    assert loaded_after("import localspec") == []
    assert loaded_after("import localspec; localspec.__all__; dir(localspec)") == []
    # the probe sees a real import: the first use of a name loads what it needs
    assert {"llama_cpp", "numpy"} <= set(loaded_after("import localspec; localspec.Engine"))


def type_checking_names(path: Path) -> dict[str, tuple[str, str]]:
    """The names `if TYPE_CHECKING:` imports in `path`, as name → (module, its name there)."""
    found = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom)
                found.update({alias.asname or alias.name: (imp.module, alias.name) for alias in imp.names})
    return found


def test_every_public_name_is_where_the_table_and_the_type_checkers_say():
    assert localspec.__all__ == sorted(localspec._API)
    assert type_checking_names(Path(localspec.__file__)) == localspec._API  # the import graph sees what is loaded
    for name, (module, attribute) in localspec._API.items():
        assert getattr(localspec, name) is getattr(__import__(module, fromlist=[attribute]), attribute)
    assert set(localspec.__all__) <= set(dir(localspec))


def test_an_unknown_name_is_an_attribute_error():
    try:
        localspec.Nothing  # noqa: B018
    except AttributeError as e:
        assert "Nothing" in str(e)
    else:
        raise AssertionError("localspec.Nothing did not raise")


def example(page: Path = API_PAGE) -> str:
    """The first Python block of the page: the ten-line example."""
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    assert blocks, f"{page} has no Python example"
    return blocks[0]


def test_the_python_api_example_runs_as_written(chat_home):
    code = example()
    assert 'localspec.load("demo")' in code and len(code.splitlines()) <= 14  # the page's promise: about ten lines
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    *text, summary = result.stdout.rstrip("\n").split("\n")
    assert "".join(text).strip(), "the example streamed no text"
    assert "target passes" in summary and "tokens/pass" in summary  # it speculated: a drafted pair's stats line
