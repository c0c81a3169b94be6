"""The chat app against what another window, a vanished folder or a kill does to it (issue 44).

Pilot on the real engine with the tiny pair and a real SQLite file shared with a second `ChatStore` (the other
window); the kill runs the real `localspec chat` in a pseudo-terminal and sends it SIGKILL, as the OOM killer does.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sqlite3
import time

import pytest
from support.terminal import WAIT
from support.tui import record_notifications, send, wait_ready, wait_until
from textual.widgets import DataTable

from localspec.tui.app import make_app
from localspec.tui.screens import HistoryScreen
from localspec.tui.store import ChatStore
from localspec.tui.widgets import ChatMessage, PromptInput

pytestmark = pytest.mark.anyio

SIZE = (110, 36)


@pytest.mark.slow
async def test_chats_list_and_export_after_the_working_folder_was_deleted(options, chat_home, tmp_path, monkeypatch):
    home = tmp_path / "user-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    gone = tmp_path / "was-here"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()  # the folder the chat was started in, deleted meanwhile
    app = make_app(dataclasses.replace(options, export_dir=None, max_tokens=1800))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        app.query_one(PromptInput).text = "Tell me a long story"
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.screen._live is not None or app.chat.turn is None, what="the answer")
        await pilot.press("f4")  # before: FileNotFoundError from Path.cwd(), the app and the answer gone
        await wait_until(pilot, lambda: isinstance(app.screen, HistoryScreen), what="the saved chats")
        await pilot.press("m")
        await wait_until(pilot, lambda: list(home.glob("chat-*.md")), what="the export in the home folder")
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.chat.turn is None, what="the answer to end")
        assert app.chat.messages[-1].role == "assistant" and app.chat.messages[-1].content


async def test_a_message_the_database_refuses_stays_in_the_prompt_box(options, chat_home):
    app = make_app(options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        seen = record_notifications(app)
        other = sqlite3.connect(chat_home.db_path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the chat database locked
        app.chat.store.db.execute("PRAGMA busy_timeout = 50")
        try:
            app.query_one(PromptInput).text = "Please keep this text"
            await pilot.press("enter")
            await wait_until(pilot, lambda: any("locked" in s for s in seen), what="the error")
            assert app.query_one(PromptInput).text == "Please keep this text"  # before: cleared, the text lost
            assert not app.query(ChatMessage) and app.chat.turn is None
        finally:
            other.execute("ROLLBACK")
            other.close()
        await pilot.press("enter")  # the lock is gone: the same text goes now
        await wait_until(pilot, lambda: app.chat.turn_ids == 1, what="the turn")
        await wait_until(pilot, lambda: app.chat.turn is None, what="the answer")
        assert app.query_one(PromptInput).text == ""
        assert [m.content for m in app.chat.store.messages(app.chat.saved_id)][0] == "Please keep this text"


async def test_a_chat_deleted_in_another_window_goes_on_as_a_new_one_and_says_so(options, chat_home):
    from localspec.tui.conversation import RESAVED

    app = make_app(options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        seen = record_notifications(app)
        await send(pilot, "Alice: hello")
        other = ChatStore(chat_home.db_path)  # the other window
        try:
            first = app.chat.saved_id
            other.delete(first)
            bob = other.create_conversation("Bob's chat")
            other.add_message(bob, "user", "Bob: hi")
            await send(pilot, "Alice: still there?")
            assert RESAVED in seen
            assert [m.content for m in other.messages(bob)] == ["Bob: hi"]  # nothing of Alice's in Bob's chat
            assert app.chat.saved_id not in (first, bob)
            assert [m.role for m in other.messages(app.chat.saved_id)] == ["user", "assistant"] * 2
        finally:
            other.close()


async def test_the_chats_list_survives_a_chat_deleted_in_another_window(options, chat_home):
    app = make_app(options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Hello")
        await pilot.press("f4")
        await wait_until(pilot, lambda: isinstance(app.screen, HistoryScreen), what="the saved chats")
        other = ChatStore(chat_home.db_path)
        other.delete(app.chat.saved_id)
        other.close()
        await pilot.press("r")  # before: HistoryError out of the key handler, the app gone
        await pilot.press("d")
        await wait_until(pilot, lambda: app.screen.query_one(DataTable).row_count == 0, what="the list re-read")
        assert isinstance(app.screen, HistoryScreen)


def saved_answer(db_path) -> tuple[str, str] | None:
    """(finish reason, text) of the answer saved so far, read as another process would, or None."""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT finish_reason, content FROM messages WHERE role = 'assistant'").fetchone()
    except sqlite3.Error:
        return None
    finally:
        db.close()
    return row


@pytest.mark.slow
def test_a_chat_killed_mid_answer_keeps_what_it_had_written(chat_in_terminal, chat_home):
    chat = chat_in_terminal("--max-tokens", "1800", "--drafter", "none")
    chat.wait_for("ready ·".encode(), "ready (models loaded)")
    chat.type("Tell me a long story\r")
    deadline = time.monotonic() + WAIT
    while (row := saved_answer(chat_home.db_path)) is None:  # before: nothing until the answer ended
        assert time.monotonic() < deadline and chat.process.poll() is None, "no answer saved while it grew"
        time.sleep(0.02)
    os.kill(chat.process.pid, signal.SIGKILL)  # what the OOM killer does: nothing of ours runs after it
    assert chat.process.wait(timeout=WAIT) == -signal.SIGKILL
    assert row[0] == "interrupted", f"the answer ended before the kill: {row}"
    store = ChatStore(chat_home.db_path)
    try:
        [conversation] = store.conversations()
        [question, answer] = store.messages(conversation.id)
        assert (question.content, answer.finish_reason) == ("Tell me a long story", "interrupted")
        assert answer.content and "".join(t for t, _ in answer.provenance) == answer.content
    finally:
        store.close()


def _next_command_on_a_terminal() -> str:
    """What `localspec models` writes to its terminal (stderr on a pty)."""
    import contextlib
    import pty
    import subprocess
    import sys

    main_side, terminal = pty.openpty()
    try:
        code = subprocess.run(
            [sys.executable, "-m", "localspec", "models"], stdout=subprocess.DEVNULL, stderr=terminal, timeout=120
        ).returncode
        os.close(terminal)
        seen = b""
        with contextlib.suppress(OSError):  # EIO once the terminal side is closed and read empty
            while chunk := os.read(main_side, 4096):
                seen += chunk
    finally:
        os.close(main_side)
    assert code == 0
    return seen.decode("utf-8", errors="replace")


@pytest.mark.slow
def test_a_chat_killed_by_sigkill_has_its_terminal_reset_by_the_next_command(chat_in_terminal, chat_home):
    from localspec.cli.crashes import TERMINAL_RESET

    chat = chat_in_terminal()
    chat.wait_for("ready ·".encode(), "ready (models loaded)")
    os.kill(chat.process.pid, signal.SIGKILL)  # the OOM killer: the app cannot restore the terminal
    assert chat.process.wait(timeout=WAIT) == -signal.SIGKILL
    text = _next_command_on_a_terminal()  # before: nothing reset, nothing said
    assert TERMINAL_RESET in text and "the last chat (`localspec chat --pair tiny" in text
    assert "ended without cleaning up" in text and text.index(TERMINAL_RESET) < text.index("the last chat")
    assert "ended without" not in _next_command_on_a_terminal()  # said once


def _add_pairs(chat_home, tiny_models) -> None:
    """ "notok": a target llama.cpp loads but that cannot write text (refused once loaded); "gone": a local file that
    is not there; "bad": a target whose header llama.cpp would abort on (MTP layers past its blocks)."""
    from gguf import GGUFValueType as T
    from support.tinymodels import rewrite_gguf

    bad = rewrite_gguf(
        tiny_models.target, chat_home.config_dir / "bad.gguf", {"llama.nextn_predict_layers": (9, T.UINT32)}
    )
    with chat_home.config_file.open("a", encoding="utf-8") as f:
        f.write(
            f'[pairs.notok]\ntarget = {{ path = "{tiny_models.no_tokenizer}" }}\nn_ctx = 256\n'
            '[pairs.gone]\ntarget = { path = "/nonexistent/gone.gguf" }\n'
            f'[pairs.bad]\ntarget = {{ path = "{bad}" }}\n'
        )


async def _pick(pilot, name: str) -> None:
    from localspec.tui.screens import PairScreen

    app = pilot.app
    await pilot.press("f2")
    await wait_until(pilot, lambda: isinstance(app.screen, PairScreen), what="the pair list")
    table = app.screen.query_one(DataTable)
    names = [str(table.get_row_at(i)[1]) for i in range(table.row_count)]
    table.move_cursor(row=names.index(name))
    await pilot.press("enter")


@pytest.mark.slow
async def test_a_failed_switch_loads_the_working_pair_again(options, chat_home, tiny_models):
    _add_pairs(chat_home, tiny_models)
    app = make_app(options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        seen = record_notifications(app)
        await send(pilot, "Hello")
        await _pick(pilot, "notok")
        await wait_until(pilot, lambda: any("no tokenizer" in s for s in seen), what="the failed switch")
        # before: no model loaded after the failure, the chat stuck until another pair was picked
        await wait_ready(pilot)
        assert app.chat.loaded.pair.name == "tiny" and any("loading tiny again" in s for s in seen)
        await send(pilot, "Still here?")
        assert [m.role for m in app.chat.messages] == ["user", "assistant"] * 2


@pytest.mark.parametrize(("pair", "said"), [("gone", "is not a file"), ("bad", "llama.cpp would abort")])
@pytest.mark.slow
async def test_f2_offers_no_download_for_a_local_file_missing_or_damaged(options, chat_home, tiny_models, pair, said):
    from localspec.tui.screens import ConfirmScreen

    _add_pairs(chat_home, tiny_models)
    app = make_app(options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        seen = record_notifications(app)
        await _pick(pilot, pair)  # before: "Download it now, as `localspec pull` would?"
        await wait_until(pilot, lambda: any(said in s for s in seen), what="the one line")
        assert not isinstance(app.screen, ConfirmScreen) and app.chat.loaded.pair.name == "tiny"
