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


def test_with_every_a_pipe_gets_a_whole_line_now_and_then():
    """Issue #21: a long bench with stderr in a log printed nothing for minutes."""
    out, now = io.StringIO(), [100.0]
    line = StatusLine("bench: ", out, every=30.0, clock=lambda: now[0])
    for step, t in enumerate([100.0, 110.0, 129.9, 130.0, 131.0, 175.0], 1):
        now[0] = t
        line.show(f"{step}/6")
    line.clear()
    line.keep()
    assert out.getvalue() == "bench: 1/6\nbench: 4/6\nbench: 6/6\n"


def test_with_every_a_terminal_still_gets_the_rewritten_line():
    out = Terminal()
    line = StatusLine("bench: ", out, every=30.0)
    line.show("1/4")
    line.show("2/4")
    line.clear()
    assert out.getvalue() == "\r\033[Kbench: 1/4\r\033[Kbench: 2/4\r\033[K"
