"""Modules stay small enough to read whole: every module of the package is at most `MAX_LINES` lines (CONTRIBUTING
"Code map"; a module that grows past it is split at a seam, into modules that each say what they own)."""

from __future__ import annotations

from pathlib import Path

import localspec

PACKAGE_DIR = Path(localspec.__file__).parent
ROOT = PACKAGE_DIR.parent
MAX_LINES = 500
# Over the cap for now, each with why; an exemption goes when its module is split.
EXEMPT: dict[str, str] = {}


def over_cap(package: Path, cap: int = MAX_LINES) -> dict[str, int]:
    """The package's modules longer than `cap` lines, by path from the repository root."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        with path.open(encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > cap:
            found[path.relative_to(package.parent).as_posix()] = n
    return found


def test_every_module_is_at_most_500_lines():
    over = {path: n for path, n in over_cap(PACKAGE_DIR).items() if path not in EXEMPT}
    assert not over, f"over {MAX_LINES} lines (split each at a seam): {over}"


def test_an_exemption_is_only_for_a_module_still_over_the_cap():
    over = over_cap(PACKAGE_DIR)
    assert all((ROOT / path).is_file() for path in EXEMPT)
    stale = [path for path in EXEMPT if path not in over]
    assert not stale, f"{stale} are within {MAX_LINES} lines now: take them out of EXEMPT"


def test_the_check_counts_lines_and_finds_a_long_module(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "short.py").write_text("x = 1\n" * 500, encoding="utf-8")
    (package / "sub" / "long.py").write_text("x = 1\n" * 501, encoding="utf-8")
    assert over_cap(package) == {"pkg/sub/long.py": 501}
