"""What docs/DESIGN.md says of the code, checked where it can be: every module, function, class and attribute it
names exists; every number it quotes is the constant the code uses; the step is as short as it says; the loop checks
its caches where it says it does; and the server's default is the slots it describes.

The code is read with `ast` (nothing imported but the command line's parser), and the page with its line breaks
folded, so a claim may wrap anywhere. Each generic check is shown to catch what it is for.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "localspec"
DESIGN = ROOT / "docs" / "DESIGN.md"
CODE_SPAN = re.compile(r"`([^`\n]+)`")
PATH_NAME = re.compile(r"((?:[\w.]+/)*\w+\.py)(?::\s*(\w+))?")  # `core/step.py: speculative_step`, `core/kv.py`
CLASS_ATTR = re.compile(r"([A-Z]\w*)\.([a-z_]\w*)(?:\(.*\))?")  # `KVSequence.check`, `Engine.generate(target=…)`


def design() -> str:
    return DESIGN.read_text(encoding="utf-8")


def folded(text: str) -> str:
    return " ".join(text.split())


def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def top_level_names(module: ast.Module) -> set[str]:
    names = set()
    for node in module.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def classes(root: Path) -> dict[str, tuple[set[str], list[str]]]:
    """Each class of the package: (its attributes — methods, class-level fields, `self.x` set anywhere in it —, the
    names of its bases)."""
    found: dict[str, tuple[set[str], list[str]]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(tree(path)):
            if not isinstance(node, ast.ClassDef):
                continue
            attrs, bases = found.setdefault(node.name, (set(), []))
            attrs |= top_level_names(ast.Module(body=node.body, type_ignores=[]))
            for inner in ast.walk(node):
                if isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store) and _on_self(inner):
                    attrs.add(inner.attr)
            bases += [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
    return found


def _on_self(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id == "self"


def attributes(name: str, known: dict[str, tuple[set[str], list[str]]]) -> set[str]:
    """A class's attributes with its bases' that are the package's own."""
    attrs, bases = known.get(name, (set(), []))
    return attrs.union(*(attributes(b, known) for b in bases if b in known and b != name))


def unresolved(text: str, root: Path) -> list[str]:
    """Each `path.py`, `path.py: name` and `Class.attribute` of `text` that the code under `root` does not have.

    A path is looked for in the package, then from the repository's root (tests/, benchmarks/)."""
    known = classes(root / "localspec")
    found = []
    for span in CODE_SPAN.findall(text):
        if m := PATH_NAME.fullmatch(span):
            path, name = m.groups()
            file = next((p for p in (root / "localspec" / path, root / path) if p.is_file()), None)
            if file is None:
                found.append(f"`{span}`: no such file")
            elif name and name not in top_level_names(tree(file)):
                found.append(f"`{span}`: no {name} in {path}")
        elif (m := CLASS_ATTR.fullmatch(span)) and m.group(1) in known:
            cls, attr = m.groups()
            if attr not in attributes(cls, known):
                found.append(f"`{span}`: {cls} has no {attr}")
    return found


# --- names ------------------------------------------------------------------------------------------------------


def test_every_name_design_cites_exists():
    text = design()
    spans = CODE_SPAN.findall(text)
    assert sum(bool(PATH_NAME.fullmatch(s)) for s in spans) >= 40  # real citations were read
    assert sum(bool(CLASS_ATTR.fullmatch(s)) for s in spans) >= 30
    assert unresolved(text, ROOT) == []


def test_a_missing_file_function_or_attribute_is_reported(tmp_path):
    (tmp_path / "localspec" / "core").mkdir(parents=True)
    (tmp_path / "localspec" / "core" / "step.py").write_text(
        "class Engine:\n    def check(self):\n        self.n_past = 0\n\n\nclass Sub(Engine):\n    pass\n\n\n"
        "def speculative_step():\n    pass\n",
        encoding="utf-8",
    )
    text = (
        "`core/step.py: speculative_step` `core/step.py: gone` `core/nowhere.py` `Engine.check` `Sub.n_past` "
        "`Engine.check_invariants` `Sub.repair()` `Unknown.thing`"
    )
    assert unresolved(text, tmp_path) == [
        "`core/step.py: gone`: no gone in core/step.py",
        "`core/nowhere.py`: no such file",
        "`Engine.check_invariants`: Engine has no check_invariants",
        "`Sub.repair()`: Sub has no repair",
    ]


# --- numbers ----------------------------------------------------------------------------------------------------


def constant(module: str, name: str):
    """A module-level constant's value, or a class field's default (`Class.field`), read from the source."""
    owner, _, field = name.partition(".")
    for node in tree(PACKAGE / module).body:
        if field and isinstance(node, ast.ClassDef) and node.name == owner:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and getattr(item.target, "id", None) == field:
                    return ast.literal_eval(item.value)
        if not field and isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(getattr(t, "id", None) == name for t in targets):
                return ast.literal_eval(node.value)
    raise LookupError(f"{module} has no constant {name}")


CLAIMS = [  # (what DESIGN says, where the code says it, the value both mean)
    ("n in 2, 3, 4, 6, 8, 12, 16, 24, 32", "core/ngram.py", "LENGTHS", (2, 3, 4, 6, 8, 12, 16, 24, 32)),
    ("`keep_margin` (1 %)", "core/policy.py", "PolicyTuning.keep_margin", 0.01),
    ("`margin` (3 %)", "core/policy.py", "PolicyTuning.margin", 0.03),
    ("`PolicyTuning.hold` (5 %)", "core/policy.py", "PolicyTuning.hold", 0.05),
    ("`probe_budget` (3 %)", "core/policy.py", "PolicyTuning.probe_budget", 0.03),
    ("`PROMPT_CHUNK` (256) tokens a tick", "server/request.py", "PROMPT_CHUNK", 256),
    ("up to 16 tokens, point laws", "core/batchdraft.py", "MAX_DRAFT", 16),
    ("recent decodes of its shape (passes, rows) where there are three", "core/costs.py", "TRUSTED", 3),
    ("unless it beats the plain tick by 5 %", "core/batchdraft.py", "MARGIN", 0.05),
    ("(up to three sweeps; above 16 streams", "core/batchdraft.py", "SWEEPS", 3),
    ("over the drafter's last 32 answers", "core/draftread.py", "LENGTHS_KEPT", 32),
    ("where fewer than 3 answers", "core/draftread.py", "LENGTHS_ENOUGH", 3),
    ("(up to three sweeps; above 16 streams", "core/batchdraft.py", "ASCENT_STREAMS_MAX", 16),
    ("8 verified tokens' worth of evidence", "core/slots.py", "PROBE_EVIDENCE", 8.0),
    ("then one in 32, drafts 4 tokens", "core/slots.py", "PROBE_EVERY", 32),
    ("then one in 32, drafts 4 tokens", "core/slots.py", "PROBE_DRAFTS", 4),
    ("overruled but for one tick in 8", "core/slots.py", "RECHECK_EVERY", 8),
    ("the default `--parallel auto` is four slots", "core/load.py", "AUTO_SLOTS", 4),
    ("up to four generate at once", "core/load.py", "AUTO_SLOTS", 4),
]


@pytest.mark.parametrize(("said", "module", "name", "value"), CLAIMS, ids=[f"{c[2]}" for c in CLAIMS])
def test_each_number_design_quotes_is_the_codes(said, module, name, value):
    assert said in folded(design()), f"DESIGN no longer says {said!r}: update this claim"
    assert constant(module, name) == value, f"{module} {name} is not {value!r}: update DESIGN and this claim"


# --- the step and the loop ----------------------------------------------------------------------------------------


def function(module: str, name: str) -> ast.FunctionDef:
    """A top-level function of `module` (a path under localspec/)."""
    return next(n for n in tree(PACKAGE / module).body if isinstance(n, ast.FunctionDef) and n.name == name)


def method(cls: str, name: str) -> ast.FunctionDef:
    """A method of the package's one class `cls`, wherever its module is."""
    owners = [
        node
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in tree(path).body
        if isinstance(node, ast.ClassDef) and node.name == cls
    ]
    assert len(owners) == 1, f"{len(owners)} classes named {cls}"
    return next(n for n in owners[0].body if isinstance(n, ast.FunctionDef) and n.name == name)


def test_the_step_is_as_short_as_design_says():
    assert "one function of under forty lines, docstring included" in folded(design())
    step = function("core/step.py", "speculative_step")
    assert step.end_lineno - step.lineno + 1 < 40
    source = ast.get_source_segment((PACKAGE / "core" / "step.py").read_text(encoding="utf-8"), step)
    assert all(f"# {n}. " in source for n in (1, 2, 3, 4))  # its comments number Algorithm 1's steps


def calls(node: ast.AST) -> list[str]:
    """The calls in `node`, in source order, as written (`seq.check`, `speculative_step`)."""
    found = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
    return [ast.unparse(n.func) for n in sorted(found, key=lambda n: (n.lineno, n.col_offset))]


def test_the_loop_checks_every_cache_after_each_step_and_repairs_on_an_exception():
    text = folded(design())
    assert "After every step the loop checks each of its caches" in text and "(`seq.repair()`)" in text
    steps = calls(method("Generation", "_steps"))
    assert "seq.check" in steps[steps.index("speculative_step") :]
    run = calls(method("Generation", "__iter__"))
    assert "seq.repair" in run and "seq.check" in run
    caches = ast.unparse(method("Generation", "caches"))
    assert "self.target" in caches and "drafter.caches" in caches  # the target's and the drafter's


def test_the_servers_default_is_the_slots_design_describes():
    from localspec.cli.main import build_parser

    serve = next(a for a in build_parser()._actions if a.dest == "command").choices["serve"]
    parallel = next(a for a in serve._actions if "--parallel" in a.option_strings)
    assert parallel.default == "auto"
    assert "by default (`--parallel auto`) up to four generate at once" in folded(design())
