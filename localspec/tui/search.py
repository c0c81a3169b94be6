"""What the user finds again in the chat database: messages of every chat by their words (and their images' file
names), and earlier prompts.

`search` asks the FTS5 index (schema.py) with the user's words quoted, so that FTS5's own syntax — quotes, `*`, `-`,
AND/OR/NEAR, parentheses, a colon — is only text and never an error; the last word may be the start of one.
`PromptHistory` is the walk of ↑/↓ in an empty prompt box through the earlier prompts, newest first, read from the
messages of every chat (so it outlives the run). Neither knows about Textual.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

from localspec.errors import HistoryError

from .schema import SEARCH_TABLE, is_busy
from .store import ChatStore

MARK = ("\x02", "\x03")  # around the matched words in a hit's snippet
SNIPPET_WORDS = 12  # words of context FTS5's snippet() keeps around a match
HISTORY_SIZE = 200  # earlier prompts a walk reads (each once)


@dataclass(frozen=True, slots=True)
class SearchHit:
    """A message that matched a search, with the words around the match."""

    conversation_id: int
    title: str
    message_id: int
    role: str
    snippet: str  # the matched words between MARK[0] and MARK[1]
    created: str  # when the message was written


def fts_query(text: str) -> str | None:
    """The FTS5 query for the words of `text`: each quoted, all required, the last one also as a prefix (None:
    there is no word to look for)."""
    words = re.findall(r"\w+", text)
    if not words:
        return None
    return " ".join(f'"{word}"' for word in words) + "*"


def search(store: ChatStore, text: str, limit: int = 100) -> list[SearchHit]:
    """The messages of every chat (every branch) that hold all the words of `text` in their text or in the file names
    of their images, best first (a hit's snippet is from whichever matched best).

        A damaged index is rebuilt from the messages (they are only read) and asked again.

        Raises:
            HistoryError: the database cannot be read, or its damaged index could not be rebuilt (the line says why).
    """
    query = fts_query(text)
    if query is None:
        return []
    try:
        if not store.has_search_index():
            return _search_without_index(store.db, re.findall(r"\w+", text), limit)
        try:
            rows = _matches(store.db, query, limit)
        except sqlite3.DatabaseError as e:
            if is_busy(e):
                raise
            store.repair_search(e)  # a damaged index (FTS5 names its own fix, 'rebuild'): rebuilt, asked again
            rows = _matches(store.db, query, limit)
    except sqlite3.Error as e:
        raise HistoryError(_search_error(store, e)) from e
    return [SearchHit(*row) for row in rows]


def _matches(db: sqlite3.Connection, query: str, limit: int) -> list[tuple]:
    return db.execute(
        f"SELECT m.conversation_id, c.title, m.id, m.role,"
        f" snippet({SEARCH_TABLE}, -1, ?, ?, '…', {SNIPPET_WORDS}), m.created FROM {SEARCH_TABLE} s"
        f" JOIN messages m ON m.id = s.rowid JOIN conversations c ON c.id = m.conversation_id"
        f" WHERE {SEARCH_TABLE} MATCH ? ORDER BY rank, m.id DESC LIMIT ?",
        (*MARK, query, limit),
    ).fetchall()


def _search_error(store: ChatStore, error: sqlite3.Error) -> str:
    if is_busy(error):
        return f"cannot search the chat database {store.path}: another localspec holds it locked; try again in a moment"
    return f"cannot search the chat database {store.path}: {error}"


def _search_without_index(db: sqlite3.Connection, words: list[str], limit: int) -> list[SearchHit]:
    """`search` on a SQLite without FTS5: every message read and matched by LIKE (slower; a word matches inside
    longer words too), newest first."""
    where = " AND ".join("(m.content || ' ' || m.image_names) LIKE ? ESCAPE '!'" for _ in words)
    like = ["%" + re.sub(r"([!%_])", r"!\1", word) + "%" for word in words]
    rows = db.execute(
        "SELECT m.conversation_id, c.title, m.id, m.role, m.content || ' ' || m.image_names, m.created FROM messages m"
        f" JOIN conversations c ON c.id = m.conversation_id WHERE {where} ORDER BY m.id DESC LIMIT ?",
        (*like, limit),
    ).fetchall()
    hits = []
    for cid, title, mid, role, content, created in rows:
        found = re.search(re.escape(words[0]), content, re.IGNORECASE)
        at, end = (found.start(), found.end()) if found else (0, 0)
        snippet = f"{content[max(0, at - 40) : at]}{MARK[0]}{content[at:end]}{MARK[1]}{content[end : end + 40]}"
        hits.append(SearchHit(cid, title, mid, role, snippet, created))
    return hits


def prompts(store: ChatStore, limit: int = HISTORY_SIZE) -> list[str]:
    """The user's earlier messages in every chat, newest first, each once."""
    seen: dict[str, None] = {}
    for (content,) in store.db.execute("SELECT content FROM messages WHERE role = 'user' ORDER BY id DESC"):
        seen.setdefault(content, None)
        if len(seen) >= limit:
            break
    return list(seen)


class PromptHistory:
    """↑/↓ in an empty prompt box: the earlier prompts, newest first, then back to the empty box.

    A walk starts from an empty box (`step` with `fresh`): the prompts are read then, so one sent a moment ago — or in
    another window, or before a restart — is the first one ↑ shows.
    """

    def __init__(self, store: ChatStore) -> None:
        self.store = store
        self._entries: list[str] = []
        self._at = -1  # the entry shown (-1: none, the box is empty)

    def step(self, older: bool, *, fresh: bool) -> str | None:
        """The prompt to show after ↑ (`older`) or ↓; "" is the empty box again, None is nothing further that way.

        Args:
            fresh: the box is empty (a new walk); otherwise it still shows what the last step gave.
        """
        if fresh:
            if not older:
                return None
            self._entries, self._at = prompts(self.store), -1
        at = self._at + (1 if older else -1)
        if at >= len(self._entries) or at < -1:
            return None
        self._at = at
        return "" if at == -1 else self._entries[at]
