"""The one progress line: rewritten in place on a terminal, silent on a pipe or a log."""

from __future__ import annotations

import io

from localspec.progress import StatusLine


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_line_is_replaced_cleared_and_kept_on_a_terminal():
    out = Terminal()
    line = StatusLine("bench: ", out)
    line.show("1/4")
    line.show("2/4")
    line.clear()
    line.clear()  # twice: nothing more
    line.show("loading: 100%")
    line.keep()
    line.keep()
    assert out.getvalue() == "\r\033[Kbench: 1/4\r\033[Kbench: 2/4\r\033[K\r\033[Kbench: loading: 100%\n"


def test_nothing_is_written_when_stderr_is_not_a_terminal():
    out = io.StringIO()
    line = StatusLine(stream=out)
    line.show("1/4")
    line.keep()
    assert out.getvalue() == ""
