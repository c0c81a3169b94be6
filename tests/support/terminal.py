"""`localspec chat` in a real pseudo-terminal, for the tests that need a terminal Pilot does not simulate.

Pilot feeds the app key events; signals, a hung-up terminal and the bytes a terminal sends for a key burst only
exist with a real process on a real terminal. `ChatInTerminal` starts the chat on the tiny pair (LOCALSPEC_HOME
from `chat_home`) with a pty as its controlling terminal and keeps everything the app writes there.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import threading
import time

COLUMNS, ROWS = 100, 30  # wide enough for the stats panel, whose "(live)" says the answer streams
LEAVE_ALT_SCREEN, SHOW_CURSOR, MOUSE_OFF = b"\x1b[?1049l", b"\x1b[?25h", b"\x1b[?1000l"
WAIT = 60.0  # seconds for the models to load or the app to end: a hang fails the test instead of the suite


class ChatInTerminal:
    """`localspec chat` with a pseudo-terminal as its controlling terminal; `output` is all it wrote there."""

    def __init__(self, *args: str) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(COLUMNS), LINES=str(ROWS))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "localspec", "chat", "--pair", "tiny", "--seed", "1", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,  # its own session, so that the pty can be its controlling terminal
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )
        os.close(slave)
        self.output = bytearray()
        self._closing = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._closing.is_set():
            if not select.select([self.master], [], [], 0.05)[0]:
                continue
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the app ended (or the test closed the terminal)
                return
            if not data:
                return
            self.output += data

    def wait_for(self, text: bytes, what: str) -> None:
        """Wait until the app has written `text` (or fail: it exited, or WAIT passed)."""
        self.wait_for_after(0, text, what)

    def wait_for_after(self, mark: int, text: bytes, what: str) -> None:
        """Wait until the app has written `text` after the first `mark` bytes of its output."""
        deadline = time.monotonic() + WAIT
        while text not in self.output[mark:]:
            if self.process.poll() is not None:
                raise AssertionError(f"the app exited ({self.process.returncode}) waiting for {what}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} after {WAIT} s")
            time.sleep(0.05)

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close_terminal(self) -> None:
        """What closing the terminal window does: the kernel hangs the terminal up (SIGHUP, then SIGCONT).

        The reader stops first: a close while another thread is blocked reading the master only takes effect, and
        hangs the terminal up, once that read returns — never, if the app has nothing more to write.
        """
        self._closing.set()
        self._reader.join()
        os.close(self.master)
        self.master = -1

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.master >= 0:
            self._reader.join(timeout=5)
            os.close(self.master)
