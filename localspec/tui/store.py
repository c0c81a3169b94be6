"""Saved conversations: one SQLite file (stdlib sqlite3, WAL) at `Paths.db_path`, its schema built by `schema`.

A conversation's messages form a tree: an edited message, or an answer generated again, is a sibling of the one it
replaces, which is kept; the conversation shows the branch that ends at its leaf (`messages`), and each message there
knows its place among its siblings (`StoredMessage.branch`). A reasoning model's thinking is kept apart from the
answer it preceded (`reasoning`), and the app's own preferences (the thinking blocks folded or not) live here too. A
message's images are stored once each by their content hash (`image` reads one back); a branch, an edit and another
chat that show the same picture share its row, which goes when no message names it any more.
The app commits the user's message before the answer is generated, the answer as it grows (`update_message`, as
"interrupted" until it ends) and when it ends, so a crash or a kill mid-answer loses only its last seconds. Several
windows may share the file: ids are never reused (AUTOINCREMENT), and a message is appended only to the conversation
its window opened (`add_message`'s `created`), never to one that took a deleted one's place. Finding words in every chat
and the earlier prompts: search.py.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from localspec.errors import ConversationGone, HistoryError, LocalspecError
from localspec.llama.pictures import Image, read_image

from . import tree as message_tree
from .attachments import Attachment
from .records import COLUMNS, Provenance, SavedConversation, SavedImage, StoredMessage, json_or_none, loads, stored
from .schema import MIGRATIONS, SEARCH_TABLE, has_search_index, is_busy, migrate, repair_error, repair_search  # noqa: F401
from .schema import open_error as _open_error
from .schema import write_error as _write_error

log = logging.getLogger(__name__)

T = TypeVar("T")
LEAF = -1  # `add_message`'s default parent: the last message of the branch on screen


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class ChatStore:
    """The saved conversations. Use from one thread (the app's), close when done.

    Args:
        path: the SQLite file (its folder is created).
        migrations: schema steps (tests pass their own).

    Raises:
        HistoryError: the file is not a database, cannot be written, or is from a newer localspec.
    """

    def __init__(self, path: Path, *, migrations=MIGRATIONS) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.path, isolation_level=None, timeout=5.0)
            self.db.execute("PRAGMA journal_mode = WAL")
            self.db.execute("PRAGMA foreign_keys = ON")
            self.db.execute("PRAGMA synchronous = NORMAL")
            migrate(self.db, migrations)
        except (sqlite3.Error, OSError) as e:
            raise HistoryError(_open_error(self.path, e)) from e

    def close(self) -> None:
        """Close the connection."""
        self.db.close()

    def _write(self, sql: str, params: Sequence = ()) -> sqlite3.Cursor:
        return self._transaction(lambda: self.db.execute(sql, params), "BEGIN")

    def _transaction(self, work: Callable[[], T], begin: str = "BEGIN IMMEDIATE") -> T:
        """Run `work` in one transaction and commit it (or nothing of it). The search index's triggers write to it
        with every message: a damaged index fails the write, so it is rebuilt and `work` run once more — a
        damaged index must not cost the user a message.

        Raises:
            HistoryError: the database cannot be written (locked, full, read-only, damaged).
        """
        try:
            return self._commit(work, begin)
        except sqlite3.Error as e:
            if not self._search_repaired(e):
                raise HistoryError(_write_error(self.path, e)) from e
        try:
            return self._commit(work, begin)
        except sqlite3.Error as e:
            raise HistoryError(_write_error(self.path, e)) from e

    def _commit(self, work: Callable[[], T], begin: str) -> T:
        with self.db:
            self.db.execute(begin)
            return work()

    def _search_repaired(self, error: sqlite3.Error) -> bool:
        """After a write failed: whether the search index was rebuilt (it may have been the cause)."""
        if is_busy(error) or not self.has_search_index():
            return False
        try:
            repair_search(self.db)
        except sqlite3.Error as e:
            log.warning("a write failed (%s) and rebuilding the search index did not help: %s", error, e)
            return False
        log.warning("a write failed (%s): the search index was rebuilt, and the write is tried again", error)
        return True

    def has_search_index(self) -> bool:
        """Whether the file has the FTS5 index (not where SQLite was built without FTS5)."""
        return has_search_index(self.db)

    def repair_search(self, damage: sqlite3.Error) -> None:
        """Rebuild the search index, which a search found damaged (`damage`); the messages are only read.

        Raises:
            HistoryError: it could not be rebuilt; the line says what to do.
        """
        try:
            repair_search(self.db)
        except sqlite3.Error as e:
            raise HistoryError(repair_error(self.path, damage, e)) from e
        log.warning("the search index of %s was damaged (%s): rebuilt from the messages", self.path, damage)

    def create_conversation(self, title: str, *, pair: str = "", system: str = "") -> int:
        """Start a conversation; returns its id."""
        now = _now()
        cur = self._write(
            "INSERT INTO conversations (title, pair, system, created, updated) VALUES (?, ?, ?, ?, ?)",
            (title, pair, system, now, now),
        )
        return int(cur.lastrowid)

    def save_copy(
        self, title: str, messages: Sequence[dict], *, pair: str = "", system: str = "", think: bool | None = None
    ) -> tuple[int, str, list[int]]:
        """Save a conversation and its messages, one after the other, in one transaction (a chat's first message,
        or a chat on screen whose saved copy another window deleted).

        Args:
            messages: each the keyword arguments of `add_message` (role, content, and any of its fields).

        Returns:
            (its id, its `created`, the messages' ids).

        Raises:
            HistoryError: the database cannot be written (then nothing of it is).
        """
        now = _now()

        def save() -> tuple[int, list[int]]:
            cid = self.db.execute(
                "INSERT INTO conversations (title, pair, system, created, updated, think) VALUES (?, ?, ?, ?, ?, ?)",
                (title, pair, system, now, now, think),
            ).lastrowid
            ids: list[int] = []
            for message in messages:
                ids.append(self._insert(cid, now, parent_id=ids[-1] if ids else None, **message))
            self.db.execute("UPDATE conversations SET leaf_id = ? WHERE id = ?", (ids[-1] if ids else None, cid))
            return int(cid), ids

        cid, ids = self._transaction(save)
        return cid, now, ids

    def _insert(
        self,
        conversation_id: int,
        now: str,
        role: str,
        content: str,
        *,
        parent_id: int | None,
        finish_reason: str | None = None,
        stats: dict | None = None,
        provenance: Provenance | None = None,
        reasoning: str = "",
        reasoning_provenance: Provenance | None = None,
        tool_calls: list[dict] | None = None,
        images: Sequence[Attachment] = (),
    ) -> int:
        for a in images:  # content-addressed: a picture already saved (in any chat) is not stored again
            self.db.execute(
                "INSERT OR IGNORE INTO images (id, data, format, width, height) VALUES (?, ?, ?, ?, ?)",
                (a.image.id, a.image.data, a.image.format, a.image.width, a.image.height),
            )
        cur = self.db.execute(
            "INSERT INTO messages (conversation_id, role, content, created, finish_reason, stats, provenance,"
            " reasoning, reasoning_provenance, parent_id, tool_calls, images, image_names)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                conversation_id,
                role,
                content,
                now,
                finish_reason,
                json_or_none(stats),
                json_or_none(provenance),
                reasoning,
                json_or_none(reasoning_provenance),
                parent_id,
                json_or_none(tool_calls),
                json_or_none([{"id": a.image.id, "name": a.name} for a in images] or None),
                "\n".join(a.name for a in images),
            ),
        )
        return int(cur.lastrowid)

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        *,
        parent_id: int | None = LEAF,
        created: str | None = None,
        **fields,
    ) -> int:
        """Add a message after `parent_id` and commit it; it ends the branch on screen. Returns its id.

        Args:
            parent_id: the message it follows; None starts the conversation (a sibling of its first message);
                default the last message of the branch on screen.
            created: the conversation's `created` as the caller opened it: the message is added only if the
                conversation is still that one (another window may have deleted it).
            fields: the message's other columns (finish_reason, stats, provenance, reasoning,
                reasoning_provenance, tool_calls) and its `images` (`Attachment`s).

        Raises:
            ConversationGone: no such conversation (or not the one created then), or its parent was deleted.
            HistoryError: the database cannot be written (locked, full, read-only).
        """
        now = _now()

        def add() -> int:  # in one transaction: the check and the insert see the same database
            if not self._holds(conversation_id, created):
                raise ConversationGone(f"saved conversation {conversation_id} was deleted (in another window?)")
            parent = self._leaf(conversation_id) if parent_id == LEAF else parent_id
            if parent_id != LEAF and parent is not None and not self._has(conversation_id, parent):
                raise ConversationGone(f"saved message {parent} was deleted (in another window?)")
            message_id = self._insert(conversation_id, now, role, content, parent_id=parent, **fields)
            self.db.execute(
                "UPDATE conversations SET updated = ?, leaf_id = ? WHERE id = ?", (now, message_id, conversation_id)
            )
            return message_id

        return self._transaction(add)

    def update_message(
        self,
        conversation_id: int,
        message_id: int,
        content: str,
        *,
        finish_reason: str | None = None,
        stats: dict | None = None,
        provenance: Provenance | None = None,
        reasoning: str = "",
        reasoning_provenance: Provenance | None = None,
        tool_calls: list[dict] | None = None,
    ) -> None:
        """Rewrite a saved answer (one that grew since it was saved, or whose tool calls ran) and commit it.

        Raises:
            ConversationGone: the message or its conversation was deleted.
            HistoryError: the database cannot be written.
        """
        now = _now()
        row = (
            content,
            finish_reason,
            json_or_none(stats),
            json_or_none(provenance),
            reasoning,
            json_or_none(reasoning_provenance),
            json_or_none(tool_calls),
            message_id,
            conversation_id,
        )

        def update() -> None:
            cur = self.db.execute(
                "UPDATE messages SET content = ?, finish_reason = ?, stats = ?, provenance = ?, reasoning = ?,"
                " reasoning_provenance = ?, tool_calls = ? WHERE id = ? AND conversation_id = ?",
                row,
            )
            if cur.rowcount == 0:
                raise ConversationGone(f"saved message {message_id} was deleted (in another window?)")
            self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))

        self._transaction(update)

    def set_tool_calls(self, conversation_id: int, message_id: int, calls: list[dict]) -> None:
        """Record an answer's tool calls and their results so far (each result as it comes)."""
        sql = "UPDATE messages SET tool_calls = ? WHERE id = ? AND conversation_id = ?"
        if self._write(sql, (json_or_none(calls), message_id, conversation_id)).rowcount == 0:
            raise ConversationGone(f"saved message {message_id} was deleted (in another window?)")

    def _holds(self, conversation_id: int, created: str | None) -> bool:
        row = self.db.execute("SELECT created FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return row is not None and (created is None or row[0] == created)

    def _has(self, conversation_id: int, message_id: int) -> bool:
        sql = "SELECT 1 FROM messages WHERE id = ? AND conversation_id = ?"
        return self.db.execute(sql, (message_id, conversation_id)).fetchone() is not None

    def image(self, saved: SavedImage) -> Image | None:
        """The bytes of a saved message's image, checked again as a file is; None (and a warning) when they are
        missing or damaged — the message stays, without that picture."""
        row = self.db.execute("SELECT data FROM images WHERE id = ?", (saved.id,)).fetchone()
        if row is None:
            log.warning("the image %s (%s) is missing from the chat database", saved.name, saved.id[:12])
            return None
        try:
            return read_image(bytes(row[0]), name=saved.name)
        except LocalspecError as e:
            log.warning("a saved image cannot be read: %s", e)
            return None

    def attachments(self, message: StoredMessage) -> list[Attachment]:
        """A saved message's images that can still be read, with the names they were attached as."""
        images = ((saved.name, self.image(saved)) for saved in message.images)
        return [Attachment(name, image) for name, image in images if image is not None]

    def _drop_unused_images(self) -> None:
        """Remove the images no message names any more (in the transaction of the delete that freed them)."""
        self.db.execute(
            "DELETE FROM images WHERE id NOT IN (SELECT json_extract(j.value, '$.id') FROM messages m,"
            " json_each(m.images) j WHERE m.images IS NOT NULL)"
        )

    # --- the tree ------------------------------------------------------------------------------------------------

    def _leaf(self, conversation_id: int) -> int | None:
        """The last message of the branch on screen (its newest message, should the leaf be gone)."""
        row = self.db.execute(
            "SELECT m.id FROM conversations c JOIN messages m ON m.id = c.leaf_id AND m.conversation_id = c.id"
            " WHERE c.id = ?",
            (conversation_id,),
        ).fetchone()
        if row is None:
            row = self.db.execute(
                "SELECT MAX(id) FROM messages WHERE conversation_id = ?", (conversation_id,)
            ).fetchone()
        return row[0]

    def _parents(self, conversation_id: int) -> dict[int, int | None]:
        """Each message's parent (a small table: ids only)."""
        sql = "SELECT id, parent_id FROM messages WHERE conversation_id = ? ORDER BY id"
        return dict(self.db.execute(sql, (conversation_id,)).fetchall())

    def branches(self, conversation_id: int) -> dict[int, tuple[int, int]]:
        """Every message's place among its siblings (1-based) and how many they are."""
        return message_tree.places(self._parents(conversation_id))

    def set_leaf(self, conversation_id: int, message_id: int | None) -> None:
        """Show the branch that ends at `message_id` (None: no message; a regenerate shows its question alone)."""
        self._write("UPDATE conversations SET leaf_id = ? WHERE id = ?", (message_id, conversation_id))

    def show(self, conversation_id: int, message_id: int) -> None:
        """Show a branch through `message_id`: the one that goes on to the newest message written after it.

        Raises:
            ConversationGone: no such message in that conversation.
        """
        parents = self._parents(conversation_id)
        if message_id not in parents:
            raise ConversationGone(f"saved message {message_id} was deleted (in another window?)")
        self.set_leaf(conversation_id, message_tree.newest_below(parents, message_id))

    def switch(self, conversation_id: int, message_id: int, step: int) -> bool:
        """Show the branch of the sibling `step` places after `message_id` (before, when negative); False when
        there is none that way."""
        other = message_tree.sibling(self._parents(conversation_id), message_id, step)
        if other is None:
            return False
        self.show(conversation_id, other)
        return True

    def delete_last_answer(self, conversation_id: int) -> bool:
        """Remove the last message of the branch on screen if it is an answer."""
        leaf = self._leaf(conversation_id)
        row = self.db.execute("SELECT role FROM messages WHERE id = ?", (leaf,)).fetchone()
        if row is None or row[0] != "assistant":
            return False
        self.delete_message(conversation_id, leaf)
        return True

    def delete_message(self, conversation_id: int, message_id: int) -> None:
        """Remove one message and those that follow it (a user message that could not be answered); a branch on
        screen through it then ends at the message before it."""
        parents = self._parents(conversation_id)
        if message_id in message_tree.path(parents, self._leaf(conversation_id)):
            self.set_leaf(conversation_id, parents[message_id])

        def delete() -> None:
            sql = "DELETE FROM messages WHERE id = ? AND conversation_id = ?"
            self.db.execute(sql, (message_id, conversation_id))
            self._drop_unused_images()

        self._transaction(delete, "BEGIN")

    # --- conversations and preferences ----------------------------------------------------------------------------

    def rename(self, conversation_id: int, title: str) -> None:
        """Give a conversation a new title."""
        self._write("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def set_system(self, conversation_id: int, system: str) -> None:
        """Record the conversation's system prompt."""
        self._write("UPDATE conversations SET system = ?, updated = ? WHERE id = ?", (system, _now(), conversation_id))

    def set_pair(self, conversation_id: int, pair: str) -> None:
        """Record which pair the conversation now runs on."""
        self._write("UPDATE conversations SET pair = ? WHERE id = ?", (pair, conversation_id))

    def set_think(self, conversation_id: int, think: bool | None) -> None:
        """Record the conversation's thinking switch (None: the pair's default)."""
        self._write("UPDATE conversations SET think = ? WHERE id = ?", (think, conversation_id))

    def preference(self, key: str, default=None):
        """One of the app's preferences (a JSON value), or `default` when it was never set or is unreadable."""
        row = self.db.execute("SELECT value FROM preferences WHERE key = ?", (key,)).fetchone()
        value = loads(row[0]) if row else None
        return default if value is None else value

    def set_preference(self, key: str, value) -> None:
        """Remember one of the app's preferences (a JSON value)."""
        self._write(
            "INSERT INTO preferences (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, json_or_none(value)),
        )

    def delete(self, conversation_id: int) -> None:
        """Delete a conversation and its messages (and the images no other message shows)."""

        def delete() -> None:
            self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
            self._drop_unused_images()

        self._transaction(delete, "BEGIN")

    def conversations(self) -> list[SavedConversation]:
        """Every conversation, most recently updated first."""
        rows = self.db.execute(
            "SELECT c.id, c.title, c.pair, c.system, c.created, c.updated, COUNT(m.id), c.think FROM conversations c"
            " LEFT JOIN messages m ON m.conversation_id = c.id GROUP BY c.id ORDER BY c.updated DESC, c.id DESC"
        ).fetchall()
        return [SavedConversation(*row[:7], think=None if row[7] is None else bool(row[7])) for row in rows]

    def get(self, conversation_id: int) -> SavedConversation:
        """One conversation.

        Raises:
            ConversationGone: no such conversation.
        """
        row = self.db.execute(
            "SELECT c.id, c.title, c.pair, c.system, c.created, c.updated, COUNT(m.id), c.think FROM conversations c"
            " LEFT JOIN messages m ON m.conversation_id = c.id WHERE c.id = ? GROUP BY c.id",
            (conversation_id,),
        ).fetchone()
        if row is None:
            raise ConversationGone(f"no saved conversation {conversation_id}: it may have been deleted")
        return SavedConversation(*row[:7], think=None if row[7] is None else bool(row[7]))

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        """The branch on screen, in order, each message with its place among its siblings."""
        rows = self.db.execute(
            "WITH RECURSIVE path(id) AS (SELECT ? UNION SELECT m.parent_id FROM messages m JOIN path ON m.id = path.id"
            f" WHERE m.parent_id IS NOT NULL) SELECT {COLUMNS} FROM messages"
            " WHERE conversation_id = ? AND id IN path ORDER BY id",  # a parent is always older than its children
            (self._leaf(conversation_id), conversation_id),
        ).fetchall()
        places = self.branches(conversation_id)
        return [replace(stored(r), branch=places[r[0]]) for r in rows]

    def tree(self, conversation_id: int) -> list[StoredMessage]:
        """Every message of the conversation, every branch, in the order they were written."""
        sql = f"SELECT {COLUMNS} FROM messages WHERE conversation_id = ? ORDER BY id"
        places = self.branches(conversation_id)
        return [replace(stored(r), branch=places[r[0]]) for r in self.db.execute(sql, (conversation_id,))]


__all__ = [
    "LEAF",
    "MIGRATIONS",
    "ChatStore",
    "ConversationGone",
    "HistoryError",
    "SavedConversation",
    "SavedImage",
    "StoredMessage",
]
