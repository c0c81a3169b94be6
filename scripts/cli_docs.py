"""Write docs/cli.md, the command line's reference, from `localspec`'s own argument parser.

The page is generated, never edited by hand: `python scripts/cli_docs.py` rewrites it, `--check` only says whether
it is stale (tests/test_docs.py fails when it is). It is rendered from the parser's actions rather than from
`--help`'s text, whose layout changes between Python versions and terminal widths.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "cli.md"

HEADER = """# Command line

Every subcommand of `localspec` and every flag, generated from its argument parser by `python scripts/cli_docs.py`
(a test fails when this page is stale: do not edit it by hand). Each command also takes `-h` / `--help`, and
`localspec -v COMMAND …` mirrors the log to stderr. How the commands fit together: [usage.md](usage.md).
"""


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, its one-line help, its parser) for each subcommand, in the order they were added."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help or "" for choice in sub._choices_actions}
    return [(name, helps.get(name, ""), p) for name, p in sub.choices.items()]


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.dest if not action.option_strings else action.dest.upper()


def _usage(action: argparse.Action) -> str:
    """How the flag is written: `--pair PAIR`, `--cpu-moe`, `[prompt]`."""
    if action.nargs == 0:
        value = ""
    elif action.nargs == "?":
        value = f"[{_metavar(action)}]"
    elif action.nargs == "*":
        value = f"[{_metavar(action)} …]"
    elif action.nargs == "+":
        value = f"{_metavar(action)} [{_metavar(action)} …]"
    else:
        value = _metavar(action)
    if not action.option_strings:
        return value
    return ", ".join(action.option_strings) + (f" {value}" if value else "")


def _help(action: argparse.Action, prog: str) -> str:
    """The action's help as `--help` prints it (argparse's %-expansion), made safe for a table cell."""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    text = (action.help or "") % {**params, "prog": prog}
    return " ".join(text.split()).replace("|", "\\|")


def _command(name: str, parser: argparse.ArgumentParser) -> str:
    rows = [
        f"| `{_usage(action)}` | {_help(action, parser.prog)} |"
        for action in parser._actions
        if action.help is not argparse.SUPPRESS and not isinstance(action, argparse._HelpAction)
    ]
    table = ["| flag | what it does |", "|---|---|", *rows] if rows else ["No flags."]
    return "\n".join([f"## `{parser.prog}`", "", parser.description or "", "", *table, ""])


def render(parser: argparse.ArgumentParser) -> str:
    """The whole page for `parser` (localspec's, from `localspec.cli.main.build_parser`)."""
    commands = _subcommands(parser)
    index = ["| command | what it does |", "|---|---|"]
    index += [f"| [`localspec {name}`](#localspec-{name}) | {help_} |" for name, help_, _ in commands]
    parts = [HEADER, "\n".join(index) + "\n", *(_command(name, p) for name, _, p in commands)]
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))  # this checkout's localspec, installed or not
    from localspec.cli.main import build_parser

    text = render(build_parser())
    if "--check" in argv:
        if PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run `python scripts/cli_docs.py`", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
