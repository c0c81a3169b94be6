"""SIGTERM, SIGHUP and a closed terminal while the chat app streams an answer (issue #21).

Before, either signal killed `localspec chat` mid-answer: the database kept only the user's message, and after
SIGTERM the terminal stayed in the alternate screen with the mouse on and the cursor hidden. Here the real
`localspec chat` runs on the tiny pair in a subprocess whose controlling terminal is a pseudo-terminal; the test
reads what the app writes to it, types a message, signals the process (or closes the terminal) once the answer
streams, then checks the exit code, the restore sequences after the signal, and the saved answer.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import threading
import time

import pytest
from support.terminal import LEAVE_ALT_SCREEN, MOUSE_OFF, SHOW_CURSOR, WAIT, ChatInTerminal

from localspec.tui.store import ChatStore

pytestmark = pytest.mark.slow


def saved_rows(chat_home) -> list[tuple[str, str | None, str]]:
    store = ChatStore(chat_home.db_path)
    try:
        [conversation] = store.conversations()
        return [(m.role, m.finish_reason, m.content) for m in store.messages(conversation.id)]
    finally:
        store.close()


def streaming(chat: ChatInTerminal) -> int:
    """Send a long request and wait until its answer streams; returns where the output stood then."""
    chat.wait_for("ready ·".encode(), "ready (models loaded)")
    chat.type("Tell me a long story\r")
    chat.wait_for(b"(live)", "the answer streaming")
    return len(chat.output)


@pytest.mark.parametrize(
    ("signals", "code", "line"),
    [
        ((signal.SIGTERM,), 143, b"terminated"),
        ((signal.SIGHUP,), 129, b"hung up"),
        ((signal.SIGTERM, signal.SIGTERM), 143, b"terminated"),  # the second quits at once: what is shown is saved
    ],
    ids=["SIGTERM", "SIGHUP", "SIGTERM-twice"],
)
def test_a_signal_mid_answer_saves_it_and_restores_the_terminal(chat_in_terminal, chat_home, signals, code, line):
    chat = chat_in_terminal("--max-tokens", "1800")
    mark = streaming(chat)
    for i, signum in enumerate(signals):
        time.sleep(0.02 * i)
        os.kill(chat.process.pid, signum)
    assert chat.process.wait(timeout=WAIT) == code
    chat._reader.join(timeout=5)
    after = bytes(chat.output[mark:])
    for sequence in (LEAVE_ALT_SCREEN, SHOW_CURSOR, MOUSE_OFF):
        assert sequence in after, f"{sequence!r} was not written: the terminal is left as the app had it"
    assert b"localspec: " + line in after and b"Traceback" not in chat.output
    [(user, _, _), (assistant, reason, text)] = saved_rows(chat_home)
    assert (user, assistant, reason) == ("user", "assistant", "cancelled") and text


def test_closing_the_terminal_mid_answer_saves_it_and_ends_the_app(chat_in_terminal, chat_home):
    chat = chat_in_terminal("--max-tokens", "1800")
    streaming(chat)
    chat.close_terminal()
    # Textual's output thread died on the first write to the hung-up terminal, and the app then hung at exit.
    assert chat.process.wait(timeout=WAIT) == 129
    [(user, _, _), (assistant, reason, text)] = saved_rows(chat_home)
    assert (user, assistant, reason) == ("user", "assistant", "cancelled") and text


def test_a_signal_while_idle_quits_at_once(chat_in_terminal, chat_home):
    chat = chat_in_terminal()
    chat.wait_for("ready ·".encode(), "ready (models loaded)")
    mark = len(chat.output)
    os.kill(chat.process.pid, signal.SIGTERM)
    assert chat.process.wait(timeout=WAIT) == 143
    chat._reader.join(timeout=5)
    assert LEAVE_ALT_SCREEN in chat.output[mark:] and SHOW_CURSOR in chat.output[mark:]


@pytest.mark.parametrize("then", ["ctrl+q", "hang-up"])
def test_a_50kb_paste_typed_key_by_key_then_a_quit_or_a_hang_up_ends_the_app(chat_in_terminal, chat_home, then):
    """A paste that reaches the app as 50,000 keystrokes (tmux send-keys, some remote sessions), then Ctrl+Q or the
    terminal closing: the app keeps up with the keys and ends within the wait (each key re-wrapped the whole line
    before: quadratic; and a hang-up behind the backlog was lost — see the next test — leaving the process running
    with Textual's restarted input threads spinning on the dead terminal)."""
    chat = chat_in_terminal()
    chat.wait_for("ready ·".encode(), "ready (models loaded)")
    keys = ("word " * 10_000).encode()  # no bracketed paste: plain keys, as a terminal sends typing
    sent = 0
    while sent < len(keys):
        sent += os.write(chat.master, keys[sent : sent + 4096])
    if then == "ctrl+q":
        chat.type("\x11")
        assert chat.process.wait(timeout=WAIT) == 0
    else:
        chat.close_terminal()
        assert chat.process.wait(timeout=WAIT) == 129


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM])
def test_a_signal_reaches_the_app_when_the_loop_is_flooded_with_wake_ups(signum):
    """Textual's input thread wakes the event loop once per key it reads (`call_soon_threadsafe`, one byte each into
    the loop's wake-up socket). Behind a key backlog that socket is full; with asyncio's own signal handlers the
    signal's byte went into the same socket, was dropped, and the signal was never handled. Deterministic: the
    socket is filled first, then the process signals itself."""
    from localspec.tui import signals

    async def main() -> list[int]:
        loop, seen = asyncio.get_running_loop(), []
        watched = signals.watch(seen.append)
        try:
            flood = threading.Thread(target=lambda: [loop.call_soon_threadsafe(lambda: None) for _ in range(300_000)])
            flood.start()
            flood.join()
            os.kill(os.getpid(), signum)
            deadline = time.monotonic() + 10
            while not seen and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            signals.unwatch(watched)
        return seen

    previous = signal.getsignal(signum)
    assert asyncio.run(main()) == [signum]
    assert signal.getsignal(signum) == previous  # given back


class _HungUpTerminal:
    """A file whose every write fails as a hung-up terminal's does."""

    def write(self, text: str) -> int:
        raise OSError(5, "Input/output error")

    def flush(self) -> None:
        pass


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # Textual's thread dying
def test_a_hangup_frees_a_write_blocked_on_the_dead_output_thread():
    """Textual's output thread dies on the first write to a hung-up terminal; 30 writes later the event loop blocks
    for ever in the next one, so a quit queued on the loop never ran (the CI run of 2026-11-27: the app still up a
    minute after its terminal closed behind a 50 kB paste). `at_once` runs in the signal handler while the loop is
    blocked, and the replacement drains the same queue: the blocked write goes through."""
    from types import SimpleNamespace

    from textual.drivers._writer_thread import MAX_QUEUED_WRITES, WriterThread

    from localspec.tui import signals

    writer = WriterThread(_HungUpTerminal())
    writer.start()
    writer.write("the first write after the hangup")
    writer.join(timeout=WAIT)
    assert not writer.is_alive()
    for _ in range(MAX_QUEUED_WRITES):
        writer.write("x")
    driver = SimpleNamespace(_writer_thread=writer, _file=io.StringIO())

    async def main() -> None:
        watched = signals.watch(lambda _: None, at_once=lambda _: signals.discard_output(driver, fds=()))
        try:
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGHUP)).start()
            writer._queue.put("y", timeout=10)  # the loop blocked, as on Textual's write; raises queue.Full if stuck
        finally:
            signals.unwatch(watched)

    asyncio.run(main())
    deadline = time.monotonic() + WAIT
    while driver._writer_thread._queue.qsize() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # the last item taken is written
    assert driver._writer_thread is not writer and driver._file.getvalue() == "x" * MAX_QUEUED_WRITES + "y"


def test_after_a_hangup_the_sigcont_that_follows_does_not_restart_the_terminal_threads(monkeypatch):
    """The kernel sends SIGCONT after SIGHUP, and Textual's driver restarts application mode on it: a new input thread
    spins on the dead terminal, and one that missed the exit's stop kept the process from ending after the app had
    (1 run in 5 of the 50 kB paste then hang-up). After `discard_output` the real driver's SIGCONT handler starts
    nothing."""
    from textual.drivers.linux_driver import LinuxDriver

    from localspec.tui import signals

    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTSTP, signal.SIGCONT)}  # the driver's own
    try:
        driver = asyncio.run(_in_a_loop(lambda: LinuxDriver(object())))  # it keeps the running loop
        started = []
        monkeypatch.setattr(driver, "start_application_mode", lambda: started.append("restarted"))
        driver._sigcont_application()
        assert started == ["restarted"]  # a SIGCONT restarts it while the terminal is there (Ctrl+Z, then fg)
        signals.discard_output(driver, fds=())
        driver._sigcont_application()
        assert started == ["restarted"]
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


async def _in_a_loop(make):
    return make()
