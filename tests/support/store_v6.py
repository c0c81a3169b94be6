"""Today's chat store, frozen at commit 2b7799d (schema version 6: tool calls): it writes databases as that release
did. Migration tests open a database this module wrote with the current `ChatStore` and check that every chat is
intact. Its schema steps, its records and its store, verbatim (schema.py, records.py, then store.py).
"""

from __future__ import annotations

# ruff: noqa: E402, F811, I001  (the three modules, one after the other)
import logging
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

from localspec.errors import HistoryError

log = logging.getLogger(__name__)

SEARCH_TABLE = "messages_fts"  # the FTS5 index of messages.content (absent where SQLite was built without FTS5)
SEARCH_COLUMNS = "content, content='messages', content_rowid='id', tokenize='unicode61 remove_diacritics 2'"


def _m001_conversations(db: sqlite3.Connection) -> None:
    db.execute(
        "CREATE TABLE conversations ("
        " id INTEGER PRIMARY KEY,"
        " title TEXT NOT NULL,"
        " pair TEXT NOT NULL DEFAULT '',"
        " system TEXT NOT NULL DEFAULT '',"
        " created TEXT NOT NULL,"
        " updated TEXT NOT NULL)"
    )
    db.execute(
        "CREATE TABLE messages ("
        " id INTEGER PRIMARY KEY,"
        " conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,"
        " role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),"
        " content TEXT NOT NULL,"
        " created TEXT NOT NULL,"
        " finish_reason TEXT,"
        " stats TEXT,"  # JSON: Stats.to_dict() of the turn that wrote this answer
        " provenance TEXT)"  # JSON: [[text, from_draft], ...]
    )
    db.execute("CREATE INDEX messages_by_conversation ON messages (conversation_id, id)")


def _m002_thinking(db: sqlite3.Connection) -> None:
    db.execute("ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT ''")  # an answer's thinking
    db.execute("ALTER TABLE messages ADD COLUMN reasoning_provenance TEXT")  # JSON: its [[text, from_draft], ...]
    db.execute("ALTER TABLE conversations ADD COLUMN think INTEGER")  # the chat's thinking switch; NULL: the pair's
    db.execute("CREATE TABLE preferences (key TEXT PRIMARY KEY, value TEXT NOT NULL)")  # the app's, as JSON


def _m003_ids_never_reused(db: sqlite3.Connection) -> None:
    """Both tables rebuilt with AUTOINCREMENT, every row kept: a deleted chat's id never names another one.

    SQLite's way to change a column (create, copy, drop, rename); `migrate` turns foreign keys off around the
    step, so dropping the old conversations does not cascade into the messages."""
    tables = {
        "conversations": (
            "id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, pair TEXT NOT NULL DEFAULT '',"
            " system TEXT NOT NULL DEFAULT '', created TEXT NOT NULL, updated TEXT NOT NULL, think INTEGER"
        ),
        "messages": (
            "id INTEGER PRIMARY KEY AUTOINCREMENT,"
            " conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,"
            " role TEXT NOT NULL CHECK (role IN ('user', 'assistant')), content TEXT NOT NULL, created TEXT NOT NULL,"
            " finish_reason TEXT, stats TEXT, provenance TEXT, reasoning TEXT NOT NULL DEFAULT '',"
            " reasoning_provenance TEXT"
        ),
    }
    for table, columns in tables.items():
        names = ", ".join(row[1] for row in db.execute(f"PRAGMA table_info({table})"))
        db.execute(f"CREATE TABLE {table}_new ({columns})")
        db.execute(f"INSERT INTO {table}_new ({names}) SELECT {names} FROM {table}")
        db.execute(f"DROP TABLE {table}")
        db.execute(f"ALTER TABLE {table}_new RENAME TO {table}")
    db.execute("CREATE INDEX messages_by_conversation ON messages (conversation_id, id)")
    if db.execute("PRAGMA foreign_key_check").fetchone() is not None:
        raise sqlite3.IntegrityError("a message of no conversation")  # the step is rolled back whole


def _m004_branches(db: sqlite3.Connection) -> None:
    """Messages as a tree: each follows its parent (the one before it, for every message written so far), and a
    conversation shows the branch that ends at its leaf (its last message, so far). User messages are indexed for
    the prompt history."""
    db.execute("ALTER TABLE messages ADD COLUMN parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE")
    db.execute("ALTER TABLE conversations ADD COLUMN leaf_id INTEGER")
    db.execute(
        "UPDATE messages SET parent_id = (SELECT MAX(p.id) FROM messages p"
        " WHERE p.conversation_id = messages.conversation_id AND p.id < messages.id)"
    )
    db.execute(
        "UPDATE conversations SET leaf_id = (SELECT MAX(id) FROM messages WHERE conversation_id = conversations.id)"
    )
    db.execute("CREATE INDEX messages_by_parent ON messages (parent_id)")
    db.execute("CREATE INDEX messages_by_role ON messages (role, id)")


def _m005_search(db: sqlite3.Connection) -> None:
    """The full-text index of every message, kept by triggers (an external-content FTS5 table: the text is stored
    once, in messages). A table rebuild of `messages` in a later step must drop and recreate these triggers."""
    if not has_fts5(db):
        log.warning("this SQLite has no FTS5: searching the chats reads every message instead")
        return
    db.execute(f"CREATE VIRTUAL TABLE {SEARCH_TABLE} USING fts5({SEARCH_COLUMNS})")
    add, drop = (
        f"INSERT INTO {SEARCH_TABLE} (rowid, content) VALUES (new.id, new.content);",
        f"INSERT INTO {SEARCH_TABLE} ({SEARCH_TABLE}, rowid, content) VALUES ('delete', old.id, old.content);",
    )
    db.execute(f"CREATE TRIGGER messages_search_insert AFTER INSERT ON messages BEGIN {add} END")
    db.execute(f"CREATE TRIGGER messages_search_delete AFTER DELETE ON messages BEGIN {drop} END")
    db.execute(f"CREATE TRIGGER messages_search_update AFTER UPDATE OF content ON messages BEGIN {drop} {add} END")
    db.execute(f"INSERT INTO {SEARCH_TABLE} ({SEARCH_TABLE}) VALUES ('rebuild')")  # every message written so far


def _m006_tool_calls(db: sqlite3.Connection) -> None:
    """An answer's tool calls (MCP, in the chat) with each one's result, as JSON on the answer that made them: a
    round of calls and results stays one row of the tree, so every branch operation treats it as one answer."""
    db.execute(
        "ALTER TABLE messages ADD COLUMN tool_calls TEXT"
    )  # JSON: [{id, server, name, arguments, status, result}]


def open_error(path: Path, error: Exception) -> str:
    """One line for a database that cannot be opened: a folder problem is not the file's fault."""
    from localspec.paths import HOME_ENV, folder_problem

    problem = folder_problem(path.parent)
    if problem:
        return (
            f"cannot create the chat database in {path.parent}: {problem} — set {HOME_ENV} to a writable "
            "folder, or fix that one"
        )
    if path.exists() and isinstance(error, sqlite3.DatabaseError) and not isinstance(error, sqlite3.OperationalError):
        return f"cannot open the chat database {path}: {error}; move it away to start a fresh one"
    return f"cannot open the chat database {path}: {error}; check its permissions and free disk space"


def write_error(path: Path, error: sqlite3.Error) -> str:
    """One line for a write that failed: a lock held by another process says who to wait for."""
    if is_busy(error):
        return (
            f"cannot save to the chat database {path}: another localspec holds it locked; try again in a "
            "moment (what you typed is kept)"
        )
    return f"cannot save to the chat database {path}: {error}"


def has_search_index(db: sqlite3.Connection) -> bool:
    """Whether the file has the FTS5 index (not where SQLite was built without FTS5)."""
    return db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (SEARCH_TABLE,)).fetchone() is not None


def repair_error(path: Path, damage: sqlite3.Error, error: sqlite3.Error) -> str:
    """One line for a damaged search index that could not be rebuilt: what to do about what stopped it."""
    if is_busy(error):
        fix = "another localspec holds the file locked: search again in a moment (the index is rebuilt then)"
    elif "readonly" in str(error) or "read-only" in str(error):
        fix = "make the file writable and search again (the index is rebuilt then)"
    else:
        fix = f"the file itself is damaged: copy it away and recover it (`sqlite3 {path} .recover | sqlite3 new.db`)"
    return (
        f"cannot search the chat database {path}: its search index is damaged ({damage}) and rebuilding it failed"
        f" ({error}); {fix}"
    )


def repair_search(db: sqlite3.Connection) -> None:
    """Rebuild the search index from the messages (FTS5's own 'rebuild'). Where the index's own tables are too
    damaged for that (its structure record or config lost, a table gone), they are first replaced by those of a
    fresh, empty index. The messages are only read.

    Raises:
        sqlite3.Error: it could not be rebuilt (the file is read-only or locked, or the messages are damaged too).
    """
    rebuild = f"INSERT INTO {SEARCH_TABLE} ({SEARCH_TABLE}) VALUES ('rebuild')"
    try:
        with db:
            db.execute("BEGIN IMMEDIATE")
            db.execute(rebuild)
        return
    except sqlite3.DatabaseError as e:
        if is_busy(e):
            raise
        log.warning("the search index cannot be rebuilt as it is (%s): replacing its tables", e)
    with db:
        db.execute("BEGIN IMMEDIATE")
        _fresh_search_tables(db)
        db.execute(rebuild)


def _fresh_search_tables(db: sqlite3.Connection) -> None:
    """Replace the index's shadow tables by those of a fresh index of the same definition (made in `temp`): their
    columns and first rows are FTS5's own, whatever this SQLite's version writes."""
    fresh = "localspec_fresh_fts"
    db.execute(f"CREATE VIRTUAL TABLE temp.{fresh} USING fts5({SEARCH_COLUMNS})")
    tables = db.execute(
        "SELECT name, sql FROM temp.sqlite_master WHERE type = 'table' AND name LIKE ? ESCAPE '!'",
        (fresh.replace("_", "!_") + "!_%",),
    ).fetchall()
    for name, sql in tables:
        ours = SEARCH_TABLE + name[len(fresh) :]
        db.execute(f'DROP TABLE IF EXISTS main."{ours}"')
        db.execute(sql.replace(f"'{name}'", f'main."{ours}"', 1))
        db.execute(f'INSERT INTO main."{ours}" SELECT * FROM temp."{name}"')
    db.execute(f"DROP TABLE temp.{fresh}")


def is_busy(error: sqlite3.Error) -> bool:
    """Whether another connection holds the file locked (then waiting, not repairing, is the fix)."""
    return "locked" in str(error) or "busy" in str(error)


def has_fts5(db: sqlite3.Connection) -> bool:
    """Whether this SQLite has FTS5 (Python's own builds do; a system library may not)."""
    try:
        db.execute("CREATE VIRTUAL TABLE temp.fts5_probe USING fts5(text)")
    except sqlite3.OperationalError:
        return False
    db.execute("DROP TABLE temp.fts5_probe")
    return True


MIGRATIONS: Sequence[Callable[[sqlite3.Connection], None]] = (
    _m001_conversations,
    _m002_thinking,
    _m003_ids_never_reused,
    _m004_branches,
    _m005_search,
    _m006_tool_calls,
)
"""Schema steps; the database's user_version is how many have run. Append, never edit."""


def migrate(db: sqlite3.Connection, migrations: Sequence[Callable[[sqlite3.Connection], None]] = MIGRATIONS) -> int:
    """Bring the schema up to date, one transaction per step.

    Returns:
        The schema version now in the file.

    Raises:
        HistoryError: the file was written by a newer localspec.
    """
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > len(migrations):
        raise HistoryError(
            f"the chat database has schema version {version}, newer than this localspec "
            f"knows ({len(migrations)}): upgrade localspec"
        )
    foreign_keys = db.execute("PRAGMA foreign_keys").fetchone()[0]
    db.execute("PRAGMA foreign_keys = OFF")  # a table rebuilt must not cascade (it is a no-op inside a transaction)
    try:
        for number in range(version, len(migrations)):
            with db:  # one transaction: a step is applied whole or not at all
                db.execute("BEGIN")
                migrations[number](db)
                db.execute(f"PRAGMA user_version = {number + 1}")
            log.info("chat database migrated to schema version %d", number + 1)
    finally:
        db.execute(f"PRAGMA foreign_keys = {int(foreign_keys)}")
    return len(migrations)


# --- records.py ---

import json
import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

Provenance = list[tuple[str, bool]]
"""An answer's text as runs of (text, came from the draft)."""

COLUMNS = (
    "id, role, content, created, finish_reason, stats, provenance, reasoning, reasoning_provenance, parent_id,"
    " tool_calls"
)


@dataclass(frozen=True, slots=True)
class SavedConversation:
    """One saved conversation (without its messages)."""

    id: int
    title: str
    pair: str
    system: str
    created: str
    updated: str
    n_messages: int = 0
    think: bool | None = None  # the chat's thinking switch (None: the pair's default)


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One saved message."""

    id: int
    role: str
    content: str
    created: str
    finish_reason: str | None = None
    stats: dict | None = None
    provenance: Provenance | None = None
    reasoning: str = ""  # an answer's thinking, apart from its content
    reasoning_provenance: Provenance | None = None
    parent_id: int | None = None  # the message it follows (None: the conversation's first)
    branch: tuple[int, int] = (1, 1)  # its place among the messages that follow the same one (1-based), and how many
    tool_calls: list[dict] | None = None  # an answer's tool calls and their results (tool_calls.py: `SavedCall`)


def stored(r: tuple) -> StoredMessage:
    """A `StoredMessage` from a row of `COLUMNS` (its `branch` is the store's to set)."""
    return StoredMessage(
        id=r[0],
        role=r[1],
        content=r[2],
        created=r[3],
        finish_reason=r[4],
        stats=loads(r[5]),
        provenance=_provenance(loads(r[6])),
        reasoning=r[7],
        reasoning_provenance=_provenance(loads(r[8])),
        parent_id=r[9],
        tool_calls=loads(r[10]),
    )


def json_or_none(value) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def loads(text: str | None):
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        log.warning("ignoring an unreadable JSON column in the chat database")
        return None


def _provenance(value) -> Provenance | None:
    if not isinstance(value, list):
        return None
    return [(str(text), bool(from_draft)) for text, from_draft in value]


# --- store.py ---

import logging
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from localspec.errors import ConversationGone, HistoryError

from localspec.tui import tree as message_tree

_open_error = open_error
_write_error = write_error

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
    ) -> int:
        cur = self.db.execute(
            "INSERT INTO messages (conversation_id, role, content, created, finish_reason, stats, provenance,"
            " reasoning, reasoning_provenance, parent_id, tool_calls) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                reasoning_provenance, tool_calls).

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
        self._write("DELETE FROM messages WHERE id = ? AND conversation_id = ?", (message_id, conversation_id))

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
        """Delete a conversation and its messages."""
        self._write("DELETE FROM conversations WHERE id = ?", (conversation_id,))

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
