"""The type check's pieces (scripts/typecheck.py; CI runs mypy itself, .ci/run): a file with more errors than its
baseline fails and is named with its errors, one with fewer passes and says how to lower the baseline, an update
never raises a count; the baseline, the pinned mypy and CI agree; and the scheduler asks its runner only through its
typed `Host` protocol, which the Runner answers with public names.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections import Counter
from pathlib import Path

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
localspec/core/b.py:12: error: Name "f" already defined on line 3  [no-redef]
Found 3 errors in 2 files (checked 3 source files)
"""


def baseline(counts: dict[str, int], version: str = "2.4.1") -> str:
    return typecheck().write_baseline(version, Counter(counts))


def test_errors_are_counted_per_file_and_notes_are_not():
    assert typecheck().count(REPORT) == {"localspec/a.py": 2, "localspec/core/b.py": 1}


def test_the_baseline_reads_back_what_was_written():
    tc = typecheck()
    text = baseline({"localspec/a.py": 2, "localspec/core/b.py": 1, "localspec/gone.py": 0})
    assert "gone.py" not in text
    assert tc.read_baseline(text) == ("2.4.1", Counter({"localspec/a.py": 2, "localspec/core/b.py": 1}))


def test_as_many_errors_as_the_baseline_pass():
    status, said = typecheck().check(REPORT, "2.4.1", baseline({"localspec/a.py": 2, "localspec/core/b.py": 1}))
    assert status == 0 and said == "mypy 2.4.1: 3 errors, baseline 3"


def test_a_file_with_more_errors_fails_and_shows_them():
    status, said = typecheck().check(REPORT, "2.4.2", baseline({"localspec/a.py": 1, "localspec/core/b.py": 1}))
    assert status == 1
    assert "  localspec/a.py: 2 now, 1 in the baseline" in said and "core/b.py" not in said
    assert 'localspec/a.py:9:5: error: Item "None" has no attribute "x"  [union-attr]' in said
    assert "(the baseline was written with mypy 2.4.1, this is 2.4.2)" in said


def test_a_new_file_with_errors_fails_though_the_total_shrank():
    status, said = typecheck().check(REPORT, "2.4.1", baseline({"localspec/a.py": 9}))
    assert status == 1 and "  localspec/core/b.py: 1 now, 0 in the baseline" in said
    assert "(3 errors in all, baseline 9: where code moved between files" in said  # how to record a move
    _, said = typecheck().check(REPORT, "2.4.1", baseline({"localspec/a.py": 1, "localspec/core/b.py": 1}))
    assert "moved" not in said


def test_fewer_errors_pass_and_say_how_to_lower_the_baseline():
    status, said = typecheck().check(REPORT, "2.4.1", baseline({"localspec/a.py": 2, "localspec/core/b.py": 4}))
    assert status == 0
    assert "  localspec/core/b.py: 1 now, 4 in the baseline" in said
    assert "run `python scripts/typecheck.py --update`" in said


def test_an_update_lowers_counts_and_never_raises_one_unless_asked():
    tc = typecheck()
    old = baseline({"localspec/a.py": 5, "localspec/core/b.py": 1})
    status, _, text = tc.update(REPORT, "2.4.1", old, grow=False)
    assert status == 0 and tc.read_baseline(text)[1] == {"localspec/a.py": 2, "localspec/core/b.py": 1}
    status, said, text = tc.update(REPORT, "2.4.1", baseline({"localspec/a.py": 1}), grow=False)
    assert status == 1 and text is None and "localspec/core/b.py: 1 now, 0 in the baseline" in said
    status, _, text = tc.update(REPORT, "2.5.0", baseline({"localspec/a.py": 1}), grow=True)
    assert status == 0 and tc.read_baseline(text) == ("2.5.0", tc.count(REPORT))


# --- the real set-up ------------------------------------------------------------------------------------------


def test_the_baseline_is_the_pinned_mypys_and_ci_runs_the_check():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    pinned = re.search(r'"mypy==([\w.]+)"', pyproject)
    version, counts = typecheck().read_baseline((ROOT / ".ci" / "mypy-baseline.txt").read_text(encoding="utf-8"))
    assert pinned and version == pinned.group(1)
    assert counts and all(path.startswith("localspec/") and (ROOT / path).is_file() for path in counts)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    lint = next(i for i, line in enumerate(ci) if line.startswith(".venv/bin/ruff check"))
    assert ci.index(".venv/bin/python scripts/typecheck.py") > lint  # after the tests and the lint
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
