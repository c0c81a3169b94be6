"""The type check's pieces (scripts/typecheck.py; CI runs mypy itself, .ci/run): an error the baseline does not list
fails and is shown, even where another was fixed; a fixed one passes and says how to lower the baseline; an update
never adds an error; the baseline, the pinned mypy and CI agree; and the scheduler asks its runner only through its
typed `Host` protocol, which the Runner answers with public names.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections import Counter
from pathlib import Path

import pytest

from localspec.server.runner import Runner
from localspec.server.scheduler import Host

ROOT = Path(__file__).resolve().parents[1]


def typecheck():
    spec = importlib.util.spec_from_file_location("typecheck", ROOT / "scripts" / "typecheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REPORT = """\
localspec/a.py:3: error: Incompatible types in assignment  [assignment]
localspec/a.py:3: note: Left operand is of type "int | None"
localspec/a.py:9:5: error: Item "None" has no attribute "x"  [union-attr]
localspec/a.py:14:5: error: Item "None" has no attribute "x"  [union-attr]
localspec/core/b.py:12: error: Name "f" already defined on line 3  [no-redef]
Found 4 errors in 2 files (checked 3 source files)
"""
ASSIGNMENT = ("localspec/a.py", "assignment", "Incompatible types in assignment")
NONE_X = ("localspec/a.py", "union-attr", 'Item "None" has no attribute "x"')
REDEF = ("localspec/core/b.py", "no-redef", 'Name "f" already defined on line N')


def baseline(*errors: tuple[str, str, str], version: str = "2.4.1") -> str:
    tc = typecheck()
    return tc.write_baseline(version, Counter(tc.Error(*e) for e in errors))


def test_errors_are_read_without_line_numbers_as_a_multiset_and_notes_are_not():
    tc = typecheck()
    found = tc.errors(REPORT)
    assert found == Counter({tc.Error(*ASSIGNMENT): 1, tc.Error(*NONE_X): 2, tc.Error(*REDEF): 1})
    moved = REPORT.replace(":3: error", ":30: error").replace("on line 3", "on line 7")  # lines added above
    assert tc.errors(moved) == found


def test_the_baseline_lists_each_error_and_reads_back_what_was_written():
    tc = typecheck()
    text = baseline(ASSIGNMENT, NONE_X, NONE_X, REDEF)
    assert 'localspec/a.py [union-attr] Item "None" has no attribute "x"\n' * 2 in text
    assert tc.read_baseline(text) == ("2.4.1", tc.errors(REPORT))


def test_the_errors_of_the_baseline_pass():
    status, said = typecheck().check(REPORT, "2.4.1", baseline(ASSIGNMENT, NONE_X, NONE_X, REDEF))
    assert status == 0 and said == "mypy 2.4.1: 4 errors, baseline 4"


def test_an_error_added_where_another_was_fixed_fails():
    """The same count in the same file: a count per file passed this; the baseline's errors themselves do not."""
    fixed_one = REPORT.replace(
        "Incompatible types in assignment  [assignment]", 'Name "y" is not defined  [name-defined]'
    )
    status, said = typecheck().check(fixed_one, "2.4.1", baseline(ASSIGNMENT, NONE_X, NONE_X, REDEF))
    assert status == 1
    assert '  localspec/a.py [name-defined] Name "y" is not defined' in said
    assert 'localspec/a.py:3: error: Name "y" is not defined  [name-defined]' in said  # mypy's line, to find it
    assert "Incompatible types" not in said


def test_one_more_of_an_error_listed_fails_and_shows_mypys_lines():
    status, said = typecheck().check(REPORT, "2.4.2", baseline(ASSIGNMENT, NONE_X, REDEF))
    assert status == 1
    assert said.startswith("mypy: 1 errors not in its baseline")
    assert 'localspec/a.py:9:5: error: Item "None" has no attribute "x"  [union-attr]' in said
    assert 'localspec/a.py:14:5: error: Item "None" has no attribute "x"  [union-attr]' in said
    assert "(the baseline was written with mypy 2.4.1, this is 2.4.2)" in said


def test_an_error_moved_to_another_file_fails_and_says_how_to_record_it():
    moved = ("localspec/c.py", *REDEF[1:])
    status, said = typecheck().check(REPORT, "2.4.1", baseline(ASSIGNMENT, NONE_X, NONE_X, moved))
    assert status == 1 and "  localspec/core/b.py [no-redef]" in said
    assert "`python scripts/typecheck.py --update --grow` records them" in said
    status, said = typecheck().check(REPORT, "2.4.1", baseline(ASSIGNMENT, NONE_X, NONE_X))
    assert status == 1 and "moved" not in said


def test_a_fixed_error_passes_and_says_how_to_lower_the_baseline():
    status, said = typecheck().check(REPORT, "2.4.1", baseline(ASSIGNMENT, NONE_X, NONE_X, NONE_X, REDEF))
    assert status == 0
    assert 'fixed, and still in the baseline:\n  localspec/a.py [union-attr] Item "None" has no attribute "x"' in said
    assert "run `python scripts/typecheck.py --update`" in said


def test_an_update_removes_fixed_errors_and_never_adds_one_unless_asked():
    tc = typecheck()
    status, _, text = tc.update(REPORT, "2.4.1", baseline(ASSIGNMENT, NONE_X, NONE_X, NONE_X, REDEF), grow=False)
    assert status == 0 and tc.read_baseline(text)[1] == tc.errors(REPORT)
    status, said, text = tc.update(REPORT, "2.4.1", baseline(ASSIGNMENT, NONE_X, REDEF), grow=False)
    assert status == 1 and text is None and 'localspec/a.py [union-attr] Item "None"' in said
    status, _, text = tc.update(REPORT, "2.5.0", baseline(ASSIGNMENT), grow=True)
    assert status == 0 and tc.read_baseline(text) == ("2.5.0", tc.errors(REPORT))


def test_a_line_that_is_no_error_is_refused_by_name():
    with pytest.raises(ValueError, match="'localspec/a.py 3'"):
        typecheck().read_baseline("# mypy 2.4.1\nlocalspec/a.py 3\n")


# --- the real set-up ------------------------------------------------------------------------------------------


def test_the_baseline_is_the_pinned_mypys_and_ci_runs_the_check():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    pinned = re.search(r'"mypy==([\w.]+)"', pyproject)
    version, listed = typecheck().read_baseline((ROOT / ".ci" / "mypy-baseline.txt").read_text(encoding="utf-8"))
    assert pinned and version == pinned.group(1)
    assert listed and all(e.path.startswith("localspec/") and (ROOT / e.path).is_file() for e in listed)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    order = [  # the set-up, then the checks that take seconds, then the suite (minutes)
        "packaging/setup.sh test",
        ".venv/bin/lint-imports --no-cache",
        ".venv/bin/ruff check . && .venv/bin/ruff format --check .",
        ".venv/bin/python scripts/typecheck.py",
        ".venv/bin/python -m pytest -q",
    ]
    assert [line for line in ci if line in order] == order
    hooks = (ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8")
    assert "entry: .venv/bin/python scripts/typecheck.py" in hooks and "language: system" in hooks
    assert "entry: '\\A[^\\n]{73,}'" in hooks and "stages: [commit-msg]" in hooks  # a subject of 72 characters at most


def test_the_runner_answers_the_schedulers_host_protocol_with_public_names():
    wanted = {name for name in vars(Host) if not name.startswith("_")}
    assert wanted >= {"served", "flags", "call_on_engine", "prepare", "checked", "with_flags", "forget"}
    runner = next(
        node
        for node in ast.parse((ROOT / "localspec" / "server" / "runner.py").read_text(encoding="utf-8")).body
        if isinstance(node, ast.ClassDef) and node.name == "Runner"
    )
    assigned = {  # the instance's own attributes, set in its methods (`self.x = …`, `self.x, self.y = …`)
        node.attr
        for node in ast.walk(runner)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and ast.unparse(node.value) == "self"
    }
    assert {"served", "flags"} <= assigned
    assert wanted <= set(dir(Runner)) | assigned


def test_the_scheduler_reaches_into_no_private_member_of_its_runner():
    source = ast.parse((ROOT / "localspec" / "server" / "scheduler.py").read_text(encoding="utf-8"))
    reached = {
        node.attr
        for node in ast.walk(source)
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "self.runner"
    }
    assert reached and not any(name.startswith("_") for name in reached)
    assert reached <= {name for name in vars(Host) if not name.startswith("_")}
