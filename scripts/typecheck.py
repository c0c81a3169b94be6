"""Type-check the package with mypy and hold its errors to a baseline that only shrinks (.ci/run, pre-commit).

mypy runs as pyproject.toml's [tool.mypy] says (basic: no strict flags, packages without types ignored) over
`localspec/`. The baseline, .ci/mypy-baseline.txt, lists the errors themselves — file, error code and message, without
the line number, which moves with every edit above it — one line per error, as a multiset: the check fails on any error
it does not list, even where another error of the same file was fixed, and says so when a listed one is gone, so that
the baseline is lowered with `python scripts/typecheck.py --update`; code moved to another file takes its errors along,
which `--update --grow` records. Offline, and deterministic for one mypy version (pinned in the `test` extra: a new one
is a deliberate bump, with its baseline).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / ".ci" / "mypy-baseline.txt"
ERROR = re.compile(r"^(?P<path>[^:\s]+\.pyi?):\d+(?::\d+)?: error: (?P<message>.*?)(?:  \[(?P<code>[\w-]+)\])?$")
ROW = re.compile(r"^(?P<path>\S+) \[(?P<code>[\w-]*)\] (?P<message>.*)$")
LINE_IN_MESSAGE = re.compile(r"\bline \d+")  # "already defined on line 3": it moves as the error's own line does
HEADER = """\
# mypy's errors in localspec/ (scripts/typecheck.py): file, [error code], message, without line numbers; one line per
# error. An error not listed here fails the check, even where another was fixed. Written by
# `python scripts/typecheck.py --update`, which only removes lines; fix a new error rather than list it.
"""


class Error(NamedTuple):
    """One mypy error as the baseline lists it: where, which check, what (no line number)."""

    path: str
    code: str
    message: str

    def row(self) -> str:
        return f"{self.path} [{self.code}] {self.message}"


def run_mypy(root: Path = ROOT) -> tuple[str, str]:
    """(mypy's version, its report) on the package, as pyproject.toml configures it.

    Raises:
        RuntimeError: mypy is missing or stopped without a report (exit 2: a crash or a bad configuration).
    """
    version = subprocess.run([sys.executable, "-m", "mypy", "--version"], capture_output=True, text=True, cwd=root)
    if version.returncode != 0:
        raise RuntimeError("mypy is not installed: run `packaging/setup.sh test` (or `.venv/bin/pip install mypy`)")
    done = subprocess.run([sys.executable, "-m", "mypy"], capture_output=True, text=True, cwd=root)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"mypy stopped (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    return version.stdout.split()[1], done.stdout


def _error(m: re.Match) -> Error:
    path = m["path"].replace("\\", "/")
    return Error(path, m["code"] or "", LINE_IN_MESSAGE.sub("line N", m["message"].strip()))


def errors(report: str) -> Counter[Error]:
    """mypy's errors in its report, each as many times as it occurs (its notes not counted)."""
    return Counter(_error(m) for line in report.splitlines() if (m := ERROR.match(line)))


def read_baseline(text: str) -> tuple[str | None, Counter[Error]]:
    """(the mypy version it was written with, the errors it lists) from the baseline's text."""
    version, listed = None, Counter[Error]()
    for line in text.splitlines():
        if m := re.match(r"# mypy (\S+)$", line):
            version = m[1]
        elif line.strip() and not line.startswith("#"):
            row = ROW.match(line)
            if row is None:
                raise ValueError(f"not a baseline line (path [code] message): {line!r}")
            listed[Error(row["path"], row["code"], row["message"])] += 1
    return version, listed


def write_baseline(version: str, found: Counter[Error]) -> str:
    rows = [error.row() for error in sorted(found.elements())]
    return HEADER + f"# mypy {version}\n" + "".join(f"{row}\n" for row in rows)


def compare(baseline: Counter[Error], now: Counter[Error]) -> tuple[Counter[Error], Counter[Error]]:
    """(the errors not in the baseline, the baseline's errors that are gone), each with its multiplicity."""
    return now - baseline, baseline - now


def _report_lines(report: str, wanted: Counter[Error]) -> list[str]:
    """mypy's own lines (with their line numbers) of every error of a kind in `wanted`."""
    return [line for line in report.splitlines() if (m := ERROR.match(line)) and _error(m) in wanted]


def _moved(new: Counter[Error], gone: Counter[Error]) -> bool:
    """Whether some new error is one that is gone from another file (code moved between files)."""
    left = {(e.code, e.message) for e in gone}
    return any((e.code, e.message) in left for e in new)


def check(report: str, version: str, baseline_text: str) -> tuple[int, str]:
    """(exit status, what to say) for mypy's `report` against the baseline."""
    base_version, baseline = read_baseline(baseline_text)
    now = errors(report)
    new, gone = compare(baseline, now)
    total, allowed = sum(now.values()), sum(baseline.values())
    if new:
        lines = [f"mypy: {sum(new.values())} errors not in its baseline (.ci/mypy-baseline.txt): fix them"]
        lines += [f"  {error.row()}" for error in sorted(new.elements())]
        lines += ["mypy's lines for errors of those kinds (the new ones among them):", *_report_lines(report, new)]
        if base_version is not None and base_version != version:
            lines.append(f"(the baseline was written with mypy {base_version}, this is {version})")
        if _moved(new, gone):
            lines.append(
                "(an error of the same kind is gone from another file: where code moved between files, its errors"
                " moved with it; `python scripts/typecheck.py --update --grow` records them where they are now)"
            )
        return 1, "\n".join(lines)
    lines = [f"mypy {version}: {total} errors, baseline {allowed}"]
    if gone:
        lines += ["fixed, and still in the baseline:", *(f"  {error.row()}" for error in sorted(gone.elements()))]
        lines.append("lower the baseline: run `python scripts/typecheck.py --update` and commit .ci/mypy-baseline.txt")
    return 0, "\n".join(lines)


def update(report: str, version: str, baseline_text: str | None, *, grow: bool) -> tuple[int, str, str | None]:
    """(exit status, what to say, the new baseline or None) — an error may only be removed unless `grow`."""
    now = errors(report)
    if baseline_text is not None and not grow:
        new, _ = compare(read_baseline(baseline_text)[1], now)
        if new:
            said = [
                "not adding errors to the baseline (fix them; --grow for moved code or a new mypy):",
                *(f"  {error.row()}" for error in sorted(new.elements())),
            ]
            return 1, "\n".join(said), None
    files = len({error.path for error in now})
    return 0, f"wrote .ci/mypy-baseline.txt: {sum(now.values())} errors in {files} files", write_baseline(version, now)


def main(argv: list[str]) -> int:
    try:
        version, report = run_mypy()
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    existing = BASELINE.read_text(encoding="utf-8") if BASELINE.is_file() else None
    try:
        if "--update" in argv:
            status, said, text = update(report, version, existing, grow="--grow" in argv)
            if text is not None:
                BASELINE.write_text(text, encoding="utf-8")
        else:
            status, said = check(report, version, existing or "")
    except ValueError as e:  # a baseline edited by hand into something else
        status, said = 1, f"{BASELINE.relative_to(ROOT)}: {e}: restore it with git (or rewrite it: `--update --grow`)"
    print(said, file=sys.stderr if status else sys.stdout)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
