"""One line of progress on stderr, rewritten in place: loading weights, reading a prompt, the bench's runs.

Written only when stderr is a terminal (a log or a pipe gets nothing), so callers never check.
"""

from __future__ import annotations

import sys
from typing import TextIO

_CLEAR = "\r\033[K"  # to the start of the line, then erase it


class StatusLine:
    """A progress line: `show` replaces it, `clear` erases it, `keep` ends it with a newline so it stays."""

    def __init__(self, prefix: str = "", stream: TextIO | None = None) -> None:
        self.prefix = prefix
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self._shown = False

    def show(self, text: str) -> None:
        """Replace the line with `prefix + text`."""
        self._write(_CLEAR + self.prefix + text)
        self._shown = True

    def clear(self) -> None:
        """Erase the line (nothing if nothing was shown)."""
        if self._shown:
            self._write(_CLEAR)
            self._shown = False

    def keep(self) -> None:
        """Leave the last line on screen and go to the next one."""
        if self._shown:
            self._write("\n")
            self._shown = False

    def _write(self, text: str) -> None:
        if self.enabled:
            self.stream.write(text)
            self.stream.flush()
