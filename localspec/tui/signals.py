"""SIGTERM and SIGHUP in the chat app: handlers on the app's event loop, and output to a terminal that is gone.

Left to their defaults both signals killed the app mid-answer: the answer was lost, and after SIGTERM the terminal
stayed in the alternate screen with the mouse on and the cursor hidden. `watch` puts handlers on the running loop
(they run between messages, so they may call the app like any handler) and the app quits as Ctrl+Q does. After
SIGHUP the terminal is usually gone, and every write to it fails: `discard_output` then sends the output to
/dev/null (a `kill -HUP` with the terminal still there leaves it alone, so the terminal is restored).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable

log = logging.getLogger(__name__)

QUIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def watch(on_signal: Callable[[int], None]) -> list[int]:
    """Call `on_signal(signum)` on the running loop for SIGTERM and SIGHUP; returns the signals now handled.

    Outside the main thread (an app run by another host) nothing is installed and the list is empty.
    """
    loop = asyncio.get_running_loop()
    handled = []
    for signum in QUIT_SIGNALS:
        try:
            loop.add_signal_handler(signum, on_signal, signum)
        except (RuntimeError, ValueError):  # not the main thread
            break
        handled.append(signum)
    return handled


def unwatch(signals: list[int]) -> None:
    """Give the signals `watch` handled back to their defaults."""
    loop = asyncio.get_running_loop()
    for signum in signals:
        loop.remove_signal_handler(signum)


def terminal_gone(fd: int = 2) -> bool:
    """Whether the terminal on `fd` hung up (Linux answers every write to a hung-up tty with EIO, even of nothing)."""
    try:
        os.write(fd, b"")
    except OSError:
        return True
    return False


def discard_output(driver: object) -> None:
    """The terminal hung up: make the app's writes to it succeed, into /dev/null.

    Textual 8.2's output thread (`driver._writer_thread`) dies on the first failed write (EIO after a hangup),
    and the app then blocks for ever on its full queue — at the latest while it restores the terminal at exit,
    so the process never ends; the SIGCONT that follows a hangup even makes Textual start a new one. stdout and
    stderr become /dev/null, and a dead output thread is replaced. Call it again before exiting.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    writer = getattr(driver, "_writer_thread", None)
    if writer is not None and not writer.is_alive() and hasattr(driver, "_file"):
        log.info("the terminal hung up: the output thread died, starting another on /dev/null")
        replacement = type(writer)(driver._file)
        replacement.start()
        driver._writer_thread = replacement
