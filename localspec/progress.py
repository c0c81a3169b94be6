"""One line of progress on stderr, rewritten in place: loading weights, reading a prompt, the bench's runs.

Written only when stderr is a terminal (a log or a pipe gets nothing), so callers never check — unless the
line is made with `every`: then a log or a pipe gets a whole line now and then (the first at once, then at most
one each `every` seconds), for work long enough that silence would look like a hang (a bench of many runs).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

_CLEAR = "\r\033[K"  # to the start of the line, then erase it


class StatusLine:
    """A progress line: `show` replaces it, `clear` erases it, `keep` ends it with a newline so it stays."""

    def __init__(
        self,
        prefix: str = "",
        stream: TextIO | None = None,
        *,
        every: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.prefix = prefix
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.every = every  # seconds between the whole lines a non-terminal gets; None: it gets nothing
        self._clock = clock
        self._last: float | None = None
        self._shown = False

    def show(self, text: str) -> None:
        """Replace the line with `prefix + text` (not a terminal, with `every`: a whole line now and then)."""
        if not self.enabled:
            now = self._clock()
            if self.every is not None and (self._last is None or now - self._last >= self.every):
                self._last = now
                self.stream.write(self.prefix + text + "\n")
                self.stream.flush()
            return
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
