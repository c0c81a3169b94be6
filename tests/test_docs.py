"""The documentation holds together: every section a file cites is a heading of the file it names, every relative
link of the docs resolves (to a file, and to a heading for an anchor), the README stays a front door, each
subcommand's --help says what it does and where its page is, and docs/cli.md is the parser's own.

A citation is `README "X"`, `docs/x.md "X"`, `CONTRIBUTING.md "X"` (a comma or a colon may follow the file); it
resolves when a heading of that file starts with X, so a long heading may be cited by its first words ("Every x86
CPU"). `DESIGN §n` is checked by test_design_refs.py. Each check is shown to catch what it is for.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from localspec.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGES.append(ROOT / "scripts" / "gpu" / "README.md")
CITATION = re.compile(r'\b(README|CONTRIBUTING|CHANGELOG|docs/[\w-]+)(?:\.md)?[,:]? "([^"\n]{2,120})"')
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SETUP = (  # the README's two set-up commands: install and chat, install and test
    "packaging/setup.sh demo && .venv/bin/localspec chat",
    "packaging/setup.sh test && .venv/bin/python -m pytest -q",
)


def citing_files() -> list[Path]:
    """Every file that may cite a section: the package, the tests, the scripts, the set-up, CI and the pages."""
    files = [*ROOT.joinpath("localspec").rglob("*.py"), *ROOT.joinpath("tests").rglob("*.py"), *PAGES]
    for folder in ("benchmarks", "scripts", "packaging"):
        files += [p for p in ROOT.joinpath(folder).rglob("*") if p.suffix in {".py", ".sh", ".md"}]
    files.append(ROOT / ".ci" / "run")
    ignored = {Path(__file__).resolve()}  # its own examples cite missing sections on purpose
    return sorted({p for p in files if p.is_file() and p.resolve() not in ignored and "results" not in p.parts})


def flat(text: str) -> str:
    """Text with line breaks, comment marks and docstring indents folded to single spaces (a wrapped citation)."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)


def headings(text: str) -> list[str]:
    """The headings of a Markdown text outside code blocks, without their marks and formatting."""
    found = []
    for line in re.sub(r"^```.*?^```", "", text, flags=re.M | re.S).splitlines():
        if m := re.match(r"#{1,6} (.+)", line):
            found.append(re.sub(r"[`*]", "", m.group(1)).strip())
    return found


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation out, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in headings(text):
        base = slug(h)
        out.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return out


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def page_of(name: str) -> Path:
    return ROOT / f"{name}.md"


def dangling_citations(files: list[Path]) -> list[str]:
    """`file: cites NAME "X"` for each citation whose page has no heading starting with X."""
    found = []
    for path in files:
        for name, section in CITATION.findall(flat(path.read_text(encoding="utf-8", errors="replace"))):
            page = page_of(name)
            titles = headings(page.read_text(encoding="utf-8")) if page.is_file() else []
            cited = section.replace("`", "")
            if not any(title.startswith(cited) for title in titles):
                found.append(f'{shown(path)}: cites {name} "{section}"')
    return found


def dangling_links(page: Path) -> list[str]:
    """`page: link` for each relative link of `page` whose file, or heading for an anchor, does not exist."""
    text = page.read_text(encoding="utf-8")
    found = []
    for target in LINK.findall(re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not ours to check here
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            found.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text(encoding="utf-8")):
            found.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    return found


# --- citations and links --------------------------------------------------------------------------------------


def test_every_cited_section_is_a_heading():
    files = citing_files()
    cited = [p for p in files if CITATION.search(flat(p.read_text(encoding="utf-8", errors="replace")))]
    assert len(cited) >= 15  # real citations were found: the package, tests, scripts and pages cite sections
    assert dangling_citations(files) == []


def test_a_citation_of_a_missing_section_is_reported(tmp_path):
    bad = tmp_path / "a.py"
    bad.write_text('# see docs/install.md "Every x86\n# CPU" and README "No such section", docs/nothing.md "Xy"\n')
    assert dangling_citations([bad]) == [
        'a.py: cites README "No such section"',
        'a.py: cites docs/nothing "Xy"',
    ]


def test_every_relative_link_of_the_docs_resolves():
    assert all(page.is_file() for page in PAGES)
    assert sum(len(LINK.findall(p.read_text(encoding="utf-8"))) for p in PAGES) >= 30  # the check reads real links
    assert [line for page in PAGES for line in dangling_links(page)] == []


def test_a_broken_link_or_anchor_is_reported(tmp_path):
    page = ROOT / "docs" / "_broken_link_test.md"
    page.write_text(
        "# T\n\n## A heading: with `code`\n\n[ok](#a-heading-with-code) [ok](install.md#set-up-two-commands) "
        "[bad](#nowhere) [bad](install.md#nowhere) [bad](missing.md) [web](https://example.org/x)\n"
        "```\n[in code](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    try:
        assert dangling_links(page) == [
            "docs/_broken_link_test.md: #nowhere (no such heading)",
            "docs/_broken_link_test.md: install.md#nowhere (no such heading)",
            "docs/_broken_link_test.md: missing.md (no such file)",
        ]
    finally:
        page.unlink()


# --- the README is a front door -------------------------------------------------------------------------------


def test_the_readme_is_short_with_install_and_quick_start_first():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150
    first = lines[:40]
    assert "## Install" in first and "## Quick start" in first
    assert "git clone" in "\n".join(first)
    assert all(command in first for command in SETUP)  # each set-up command on its own line


def test_ci_runs_the_readmes_test_command():
    """Its set-up first and its test run last, the checks that take seconds between them (.ci/run)."""
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    commands = [line for line in lines if line and not line.startswith(("#", "set ", "cd "))]
    setup, test = SETUP[1].split(" && ")
    assert commands[0] == setup and commands[-1] == test, commands


# --- the command line's help and its page ---------------------------------------------------------------------


def subcommands() -> dict:
    return next(a for a in build_parser()._actions if a.dest == "command").choices


@pytest.mark.parametrize("name", list(subcommands()))
def test_each_subcommands_help_opens_with_what_it_does_and_its_page(name, capsys):
    description = subcommands()[name].description or ""
    sentence, _, rest = description.partition(". ")
    assert sentence and sentence[0].isupper() and rest.startswith("Docs: docs/")
    page = re.match(r"Docs: (docs/[\w-]+\.md)\.$", rest)
    assert page and (ROOT / page.group(1)).is_file()
    assert main([name, "--help"]) == 0
    help_text = capsys.readouterr().out
    after_usage = help_text.split("\n\n")[1]  # argparse: the usage, then the description
    assert "".join(after_usage.split()) == "".join(description.split())  # wrapped anywhere, "llama-" too


def cli_docs():
    spec = importlib.util.spec_from_file_location("cli_docs", ROOT / "scripts" / "cli_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_page_is_the_parsers_own():
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert cli_docs().render(build_parser()) == page, "docs/cli.md is stale: run `python scripts/cli_docs.py`"


def test_a_new_flag_makes_the_cli_page_stale():
    parser = build_parser()
    before = cli_docs().render(parser)
    subcommands_of = next(a for a in parser._actions if a.dest == "command").choices
    subcommands_of["generate"].add_argument("--brand-new", type=int, help="a flag the page does not have")
    after = cli_docs().render(parser)
    assert after != before and "| `--brand-new BRAND_NEW` | a flag the page does not have |" in after
