"""Fixtures of the chat app's tests: a real SQLite chat store in a folder that does not exist yet."""

from __future__ import annotations

import pytest

from localspec.tui.store import ChatStore


@pytest.fixture
def store(tmp_path):
    """A `ChatStore` in tmp_path/data (the store makes the folder, as on first run), closed after the test."""
    s = ChatStore(tmp_path / "data" / "chats.sqlite3")
    yield s
    s.close()
