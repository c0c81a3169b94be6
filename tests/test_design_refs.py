"""Every "DESIGN §n" in the code, the tests, the scripts and the Markdown pages names a section of docs/DESIGN.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "DESIGN.md"
REF = re.compile(r"DESIGN(?:\.md)? §(\d+)")


def sections(text: str) -> set[int]:
    """The numbers of the `## n. Title` headings."""
    return {int(n) for n in re.findall(r"^## (\d+)\. \S", text, flags=re.M)}


def references() -> dict[str, set[int]]:
    """Each file of the package, the tests, the scripts and the pages that cites DESIGN, with the sections it cites."""
    files = [*ROOT.joinpath("localspec").rglob("*.py"), *ROOT.joinpath("tests").rglob("*.py"), *ROOT.glob("*.md")]
    files += [*ROOT.joinpath("docs").glob("*.md"), *ROOT.joinpath("benchmarks").rglob("*.py")]
    files += [p for p in ROOT.joinpath("scripts").rglob("*") if p.suffix in {".py", ".sh", ".md"}]
    found = {}
    for path in files:
        if path == Path(__file__).resolve():
            continue  # its own examples below cite a missing section on purpose
        cited = {int(n) for n in REF.findall(path.read_text(encoding="utf-8"))}
        if cited:
            found[str(path.relative_to(ROOT))] = cited
    return found


def dangling(refs: dict[str, set[int]], known: set[int]) -> list[str]:
    return sorted(f"{where}: §{n}" for where, cited in refs.items() for n in cited - known)


def test_every_design_reference_names_a_section():
    known = sections(DESIGN.read_text(encoding="utf-8"))
    refs = references()
    assert known >= {1, 2, 3, 4, 5, 6, 7} and len(refs) >= 10  # the sections the code cites, and real citations
    assert dangling(refs, known) == []


def test_a_reference_to_a_missing_section_is_reported():
    known = sections("# t\n\n## 1. The step\n\ntext\n\n## 2. Sampling\n")
    assert known == {1, 2}
    refs = {"a.py": {int(n) for n in REF.findall("see DESIGN §2 and DESIGN.md §9")}}
    assert dangling(refs, known) == ["a.py: §9"]
