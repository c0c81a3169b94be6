"""Type-check the package with mypy and hold its errors to a baseline that only shrinks (.ci/run, pre-commit).

mypy runs as pyproject.toml's [tool.mypy] says (basic: no strict flags, packages without types ignored) over
`localspec/`. The baseline, .ci/mypy-baseline.txt, is the number of errors in each file when it was written; the
check fails when a file has more than its baseline (a file not in it has none), and says so when one has fewer, so
that the baseline is lowered with `python scripts/typecheck.py --update`; code moved to another file takes its errors
along, which `--update --grow` records. Counts, not error lines: a line number moves with every edit above it, a count
only with the errors themselves. Offline, and deterministic for one mypy version (pinned in the `test` extra: a new
one is a deliberate bump, with its baseline).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / ".ci" / "mypy-baseline.txt"
ERROR = re.compile(r"^(?P<path>[^:\s]+\.pyi?):\d+(?::\d+)?: error: ")
HEADER = """\
# mypy's errors per file of localspec/ (scripts/typecheck.py): a file may have fewer, never more. Written by
# `python scripts/typecheck.py --update`, which only lowers counts; fix a new error rather than raise its file's count.
"""


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


def count(report: str) -> Counter[str]:
    """Errors per file in mypy's report (its notes not counted)."""
    return Counter(m["path"].replace("\\", "/") for line in report.splitlines() if (m := ERROR.match(line)))


def read_baseline(text: str) -> tuple[str | None, Counter[str]]:
    """(the mypy version it was written with, errors per file) from the baseline's text."""
    version, counts = None, Counter()
    for line in text.splitlines():
        if m := re.match(r"# mypy (\S+)$", line):
            version = m[1]
        elif line.strip() and not line.startswith("#"):
            path, n = line.rsplit(" ", 1)
            counts[path] = int(n)
    return version, counts


def write_baseline(version: str, counts: Counter[str]) -> str:
    rows = [f"{path} {n}" for path, n in sorted(counts.items()) if n > 0]
    return HEADER + f"# mypy {version}\n" + "\n".join(rows) + "\n"


def compare(baseline: Counter[str], now: Counter[str]) -> tuple[list[str], list[str]]:
    """(the files with more errors than their baseline, those with fewer)."""
    grew = [path for path in sorted(now) if now[path] > baseline[path]]
    return grew, [path for path in sorted(baseline) if now[path] < baseline[path]]


def _said(paths: list[str], baseline: Counter[str], now: Counter[str]) -> list[str]:
    return [f"  {path}: {now[path]} now, {baseline[path]} in the baseline" for path in paths]


def check(report: str, version: str, baseline_text: str) -> tuple[int, str]:
    """(exit status, what to say) for mypy's `report` against the baseline."""
    base_version, baseline = read_baseline(baseline_text)
    now = count(report)
    grew, shrank = compare(baseline, now)
    total, allowed = sum(now.values()), sum(baseline.values())
    lines = []
    if grew:
        errors = [line for line in report.splitlines() if (m := ERROR.match(line)) and m["path"] in grew]
        lines += ["mypy: more errors than its baseline (.ci/mypy-baseline.txt) in:", *_said(grew, baseline, now)]
        lines += ["their errors (fix the new ones):", *errors]
        if base_version is not None and base_version != version:
            lines.append(f"(the baseline was written with mypy {base_version}, this is {version})")
        if total <= allowed:
            lines.append(
                f"({total} errors in all, baseline {allowed}: where code moved between files, its errors moved with it;"
                " `python scripts/typecheck.py --update --grow` records them where they are now)"
            )
        return 1, "\n".join(lines)
    lines.append(f"mypy {version}: {total} errors, baseline {allowed}")
    if shrank:
        lines += ["fewer errors than the baseline in:", *_said(shrank, baseline, now)]
        lines.append("lower the baseline: run `python scripts/typecheck.py --update` and commit .ci/mypy-baseline.txt")
    return 0, "\n".join(lines)


def update(report: str, version: str, baseline_text: str | None, *, grow: bool) -> tuple[int, str, str | None]:
    """(exit status, what to say, the new baseline or None) — a count may only go down unless `grow`."""
    now = count(report)
    if baseline_text is not None and not grow:
        baseline = read_baseline(baseline_text)[1]
        grew, _ = compare(baseline, now)
        if grew:
            said = [
                "not raising the baseline (fix their new errors; --grow for moved code or a new mypy):",
                *_said(grew, baseline, now),
            ]
            return 1, "\n".join(said), None
    return (
        0,
        f"wrote .ci/mypy-baseline.txt: {sum(now.values())} errors in {len(now)} files",
        write_baseline(version, now),
    )


def main(argv: list[str]) -> int:
    try:
        version, report = run_mypy()
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    existing = BASELINE.read_text(encoding="utf-8") if BASELINE.is_file() else None
    if "--update" in argv:
        status, said, text = update(report, version, existing, grow="--grow" in argv)
        if text is not None:
            BASELINE.write_text(text, encoding="utf-8")
    else:
        status, said = check(report, version, existing or "")
    print(said, file=sys.stderr if status else sys.stdout)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
