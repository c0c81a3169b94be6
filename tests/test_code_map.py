"""The code map of CONTRIBUTING.md is scripts/code_map.py's, from the modules' own docstrings: it is regenerated
and compared, every module is on it, and a module without a docstring fails. Each check is shown to catch what it
is for, on a small tree written in tmp_path.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def code_map():
    spec = importlib.util.spec_from_file_location("code_map", ROOT / "scripts" / "code_map.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mapped(page: str) -> str:
    """The text between the page's two markers."""
    cm = code_map()
    return page[page.index(cm.BEGIN) + len(cm.BEGIN) : page.index(cm.END)].strip("\n") + "\n"


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


SMALL = {
    "localspec/__init__.py": '"""The top."""\n',
    "localspec/errors.py": '"""Every error."""\n',
    "localspec/core/__init__.py": '"""The core: the engine.\n\nIt imports llama."""\n',
    "localspec/core/step.py": '"""One step (DESIGN §1): draft, verify.\n\nMore here."""\n',
    "localspec/llama/__init__.py": '"""Native calls."""\n',
    "scripts/tool.py": '"""A tool."""\n',
}


# --- the real map ---------------------------------------------------------------------------------------------


def test_the_code_map_is_the_modules_own():
    page = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert code_map().render(ROOT) == mapped(page), "the code map is stale: run `python scripts/code_map.py`"


def test_every_module_of_the_package_is_on_the_map():
    page = mapped((ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8"))
    modules = sorted((ROOT / "localspec").rglob("*.py"))
    assert len(modules) >= 100
    for path in modules:
        folder = path.parent.relative_to(ROOT).as_posix() + "/"
        head = f"**`{folder}`**" if path.name == "__init__.py" else f"`{path.name}`"
        assert f"- {head} — " in page, f"{path.relative_to(ROOT)} is not on the code map"


def test_the_script_checks_the_page():
    assert code_map().main(["--check"]) == 0


# --- what it catches ------------------------------------------------------------------------------------------


def test_a_small_tree_is_mapped_folder_by_folder_in_layer_order(tmp_path):
    text = code_map().render(tree(tmp_path, SMALL))
    assert text == (
        "- **`localspec/`** — The top.\n"
        "  - `errors.py` — Every error.\n"
        "- **`localspec/llama/`** — Native calls.\n"
        "- **`localspec/core/`** — The core: the engine.\n"
        "  - `step.py` — One step (DESIGN §1): draft, verify.\n"
        "- **`scripts/`** — " + code_map().OTHER_FOLDERS["scripts"] + "\n"
        "  - `tool.py` — A tool.\n"
    )


def test_a_new_module_makes_the_map_stale(tmp_path):
    cm = code_map()
    before = cm.render(tree(tmp_path, SMALL))
    tree(tmp_path, {"localspec/core/verify.py": '"""Accept or reject."""\n'})
    after = cm.render(tmp_path)
    assert after != before and "  - `verify.py` — Accept or reject.\n" in after


def test_a_module_without_a_docstring_is_named(tmp_path):
    cm = code_map()
    tree(tmp_path, {**SMALL, "localspec/core/bare.py": "X = 1\n", "scripts/empty.py": '""""""\n'})
    with pytest.raises(cm.MissingDocstring) as caught:
        cm.render(tmp_path)
    assert caught.value.paths == ["localspec/core/bare.py", "scripts/empty.py"]


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        ("One line.", "One line."),
        ("A sentence that wraps\nonto the next line. Then more.", "A sentence that wraps onto the next line."),
        ("Ends with code, e.g. `x`. Then more.", "Ends with code, e.g. `x`."),
        ("What does it do? This.", "What does it do?"),
        ("`Context`: one context (see core/kv.py). `Other` next.", "`Context`: one context (see core/kv.py)."),
        ("No full stop\n\nA second paragraph.", "No full stop"),
        ("Version 1.5 of the file format.", "Version 1.5 of the file format."),
    ],
)
def test_the_summary_is_the_first_sentence(tmp_path, doc, said):
    path = tmp_path / "m.py"
    path.write_text(f'"""{doc}"""\n', encoding="utf-8")
    assert code_map().summary(path) == said


def test_a_long_summary_wraps_without_starting_a_markdown_block(tmp_path):
    words = "word " * 22 + "- a dash, + a plus, 1. a number, # a hash and > a quote " * 4
    text = code_map().render(tree(tmp_path, {"localspec/__init__.py": f'"""{words.strip()}."""\n'}))
    lines = text.splitlines()
    assert len(lines) > 2 and all(len(line) <= code_map().WIDTH for line in lines)
    assert all(re.match(r"  \S", line) and not re.match(r"  ([-+*>#]|\d+[.)]) ", line) for line in lines[1:])


def test_a_page_without_the_markers_is_refused():
    cm = code_map()
    with pytest.raises(ValueError, match="markers"):
        cm.replaced("# Contributing\n", "- x\n")
    assert cm.replaced(f"a\n{cm.BEGIN}\nold\n{cm.END}\nb\n", "- new\n") == f"a\n{cm.BEGIN}\n\n- new\n\n{cm.END}\nb\n"
