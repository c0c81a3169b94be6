"""Ctrl+C (SIGINT) and SIGTERM on the command line: stop cleanly, exit 130 / 143, no traceback.

While a generation runs, the first signal only asks it to stop: it ends after the current step with both
caches consistent. Anywhere else (loading a model, deriving the demo target), or on a second signal, the
handler raises `Interrupted`, which unwinds through every `finally` (engines close, temporary files go) to
one line and the exit code. A step cut short by an exception is rolled back by `Generation` itself.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _unraisable(hook_args) -> None:
    # `Interrupted` raised inside a ctypes callback (llama.cpp's log callback) cannot propagate and would
    # be printed with a traceback; `SignalGuard.check()` raises it again where it can be handled.
    log.debug("ignored in a callback: %r", hook_args.exc_value)


class Interrupted(KeyboardInterrupt):
    """A signal asked the command to stop; `exit_code` is 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum


class SignalGuard:
    """Context manager: SIGINT/SIGTERM handlers for one command (a no-op outside the main thread).

    Set `generation` to the running `Generation` so that a signal cancels it instead of raising.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.generation = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
            self._hook, sys.unraisablehook = sys.unraisablehook, _unraisable
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            # After a signal the command is exiting: a second one during interpreter shutdown (which
            # restores the default handlers) would kill the process instead of letting it exit 130 / 143.
            signal.signal(sig, signal.SIG_IGN if self.signum is not None else handler)
        if self._previous:
            sys.unraisablehook = self._hook
        self._previous.clear()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        first = self.signum is None
        self.signum = self.signum or signum
        if first and self.generation is not None:
            self.generation.cancel()  # ends between steps; `check()` then turns it into the exit code
            return
        raise Interrupted(self.signum)

    def check(self) -> None:
        """Raise `Interrupted` if a signal arrived (one a C callback may have swallowed, or a cancel)."""
        if self.signum is not None:
            raise Interrupted(self.signum)
