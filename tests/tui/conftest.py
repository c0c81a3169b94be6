"""Fixtures of the chat app's tests: the options of a chat on the tiny pair, a real SQLite chat store in a folder
that does not exist yet, and the chat in a real pseudo-terminal (`chat_in_terminal`)."""

from __future__ import annotations

import pytest
from support.terminal import ChatInTerminal

from localspec.tui.settings import ChatOptions
from localspec.tui.store import ChatStore


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def options(chat_home, tmp_path):
    """Options of a chat on the tiny pair; tests replace fields with dataclasses.replace (test_conversation.py
    has its own)."""
    return ChatOptions(
        pair="tiny",
        max_tokens=24,
        cursor_blink=False,
        export_dir=tmp_path / "exports",
        overrides={"seed": 1, "adaptive": False},
        stats_interval=0.05,
    )


@pytest.fixture
def store(tmp_path):
    """A `ChatStore` in tmp_path/data (the store makes the folder, as on first run), closed after the test."""
    s = ChatStore(tmp_path / "data" / "chats.sqlite3")
    yield s
    s.close()


@pytest.fixture
def chat_in_terminal(chat_home):
    """`chat_in_terminal(*args)` starts `localspec chat --pair tiny ARGS…` in a pty; killed after the test."""
    started: list[ChatInTerminal] = []

    def start(*args: str) -> ChatInTerminal:
        started.append(ChatInTerminal(*args))
        return started[-1]

    yield start
    for chat in started:
        chat.end()
