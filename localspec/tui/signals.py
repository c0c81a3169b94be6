"""SIGTERM and SIGHUP in the chat app: handlers on the app's event loop, and output to a terminal that is gone.

Left to their defaults both signals killed the app mid-answer: the answer was lost, and after SIGTERM the terminal
stayed in the alternate screen with the mouse on and the cursor hidden. `watch` puts handlers on the running loop
(they run between messages, so they may call the app like any handler) and the app quits as Ctrl+Q does, however
many typed keys are still queued. After
SIGHUP the terminal is usually gone, and every write to it fails: `discard_output` then sends the output to
/dev/null (a `kill -HUP` with the terminal still there leaves it alone, so the terminal is restored).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

QUIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@dataclass(slots=True)
class Watch:
    """The handlers `watch` installed, and what to give back when `unwatch` removes them."""

    loop: asyncio.AbstractEventLoop
    wake: tuple[socket.socket, socket.socket]  # (read end, write end): written by the C handler, drained by the loop
    previous_handlers: dict[int, object]
    previous_wakeup_fd: int


def watch(on_signal: Callable[[int], None], at_once: Callable[[int], None] | None = None) -> Watch | None:
    """Call `on_signal(signum)` on the running loop for SIGTERM and SIGHUP; None outside the main thread (an app run
    by another host: nothing is installed). `at_once(signum)`, if given, runs in the signal handler itself, before
    any queued message: what cannot wait for the loop (see `discard_output`), and must be safe at any bytecode.

    Not `loop.add_signal_handler`: asyncio learns of a signal from one byte in the socket that also wakes its loop for
    every `call_soon_threadsafe`, and Textual's input thread makes that call for each key it reads. Behind a backlog of
    typed keys the socket is full, the signal's byte is dropped, and the signal is lost (a closed terminal then left
    the app running for ever, its restarted input threads spinning on the dead tty). Here the Python handler, which
    the main thread runs whatever any socket holds, queues `on_signal` itself; a socket only signals write to wakes
    the loop, so a signal that reaches another thread is not left waiting for the loop's next event.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    loop = asyncio.get_running_loop()
    read_end, write_end = socket.socketpair()
    for end in (read_end, write_end):
        end.setblocking(False)
    loop.add_reader(read_end.fileno(), _drain, read_end)

    def handler(signum: int, _frame: object) -> None:
        if at_once is not None:
            at_once(signum)
        loop.call_soon_threadsafe(on_signal, signum)

    previous_fd = signal.set_wakeup_fd(write_end.fileno(), warn_on_full_buffer=False)
    previous = {signum: signal.signal(signum, handler) for signum in QUIT_SIGNALS}
    return Watch(loop, (read_end, write_end), previous, previous_fd)


def unwatch(watched: Watch | None) -> None:
    """Give the signals `watch` handled back to the handlers they had, and close its socket."""
    if watched is None:
        return
    for signum, previous in watched.previous_handlers.items():
        signal.signal(signum, previous)
    signal.set_wakeup_fd(watched.previous_wakeup_fd)
    watched.loop.remove_reader(watched.wake[0].fileno())
    for end in watched.wake:
        end.close()


def _drain(read_end: socket.socket) -> None:
    """Empty the wake-up socket (its bytes only woke the loop: the handlers already queued what to do)."""
    try:
        while read_end.recv(4096):
            pass
    except (BlockingIOError, InterruptedError):
        pass


def terminal_gone(fd: int = 2) -> bool:
    """Whether the terminal on `fd` hung up (Linux answers every write to a hung-up tty with EIO, even of nothing)."""
    try:
        os.write(fd, b"")
    except OSError:
        return True
    return False


def discard_output(driver: object, fds: tuple[int, ...] = (1, 2)) -> None:
    """The terminal hung up: make the app's writes to it succeed, into /dev/null.

    Textual 8.2's output thread (`driver._writer_thread`) dies on the first failed write (EIO after a hangup), and
    whoever writes next blocks for ever once its queue (30 writes) is full: the event loop itself while it renders
    the keys still queued, so the quit the signal asked for never runs; the SIGCONT that follows a hangup even makes
    Textual write from its signal handler. Call it from the signal handler (`watch`'s `at_once`), not from the loop:
    `fds` (stdout and stderr) become /dev/null, and an output thread that died — now or on a write under way — is
    replaced by one that drains the same queue, so a write blocked on it goes through. Safe to call again.

    The kernel follows the SIGHUP with a SIGCONT, on which Textual restarts application mode: a new output thread
    and a new input thread, which spins on the dead terminal (every read an instant end of file) and, when it missed
    the exit's stop, kept the process from ending after the app had (the CI runs of 2026-11-27). So the driver no
    longer restarts: Python runs the handlers of signals that arrive together in numeric order, SIGHUP first.
    """
    if hasattr(driver, "_auto_restart"):
        driver._auto_restart = False
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in fds:
            os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    writer = getattr(driver, "_writer_thread", None)
    if writer is None or not hasattr(driver, "_file") or getattr(writer, "_replaced", False):
        return
    writer._replaced = True
    threading.Thread(target=_replace_when_dead, args=(driver, writer), daemon=True, name="output-after-hangup").start()


def _replace_when_dead(driver: object, writer: threading.Thread) -> None:
    """Wait for Textual's output thread to end, then start another on the same queue and file (now /dev/null). One
    that ended at exit is followed by an idle one, a daemon that ends with the process."""
    writer.join()
    if getattr(driver, "_writer_thread", None) is not writer:  # Textual started its own since
        return
    log.info("the terminal hung up: the output thread ended, another writes to /dev/null")
    replacement = type(writer)(driver._file)
    replacement._queue = writer._queue  # a write blocked on the old queue goes through
    replacement._replaced = True
    replacement.start()
    driver._writer_thread = replacement
