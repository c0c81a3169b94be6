"""Bad input in the chat app (issue #9): a message rejected for length leaves no trace in the history."""

from __future__ import annotations

import pytest
from support.tui import record_notifications, send, wait_ready

from localspec.tui.app import make_app
from localspec.tui.settings import ChatOptions
from localspec.tui.store import ChatStore
from localspec.tui.widgets import PromptInput

pytestmark = pytest.mark.anyio


async def test_a_message_rejected_for_length_does_not_become_a_title(chat_home, tmp_path):
    options = ChatOptions(
        pair="tiny",
        n_ctx=64,
        max_tokens=24,
        cursor_blink=False,
        export_dir=tmp_path / "exports",
        overrides={"seed": 1, "adaptive": False},
        stats_interval=0.05,
    )
    app = make_app(options)
    notes = record_notifications(app)
    async with app.run_test(size=(110, 36)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "word " * 1000)
        [error] = notes
        assert "does not fit" in error
        assert app.query_one(PromptInput).text.startswith("word word")
        assert app.chat.saved_id is None
        await send(pilot, "hi")  # the next message that fits starts the conversation, with its own title
    store = ChatStore(chat_home.db_path)
    try:
        assert [c.title for c in store.conversations()] == ["hi"]
    finally:
        store.close()


async def test_what_the_cli_has_to_tell_is_shown_in_the_app(chat_home, tmp_path):
    # The CLI prints a crash of the last run before the app takes the screen, which would hide it: the app shows it.
    crash = "the last run of `localspec chat` (started …) crashed in llama.cpp with SIGSEGV while decoding"
    options = ChatOptions(pair="tiny", n_ctx=64, cursor_blink=False, export_dir=tmp_path / "exports")
    app = make_app(options, notices=(crash,))
    notes = record_notifications(app)
    async with app.run_test(size=(110, 36)) as pilot:
        await wait_ready(pilot)
        assert notes.count(crash) == 1
