"""Saved conversations: one SQLite file (stdlib sqlite3, WAL) at `Paths.db_path`.

The schema is versioned by `PRAGMA user_version` and built by `MIGRATIONS`, a list of small functions
applied in order, each in its own transaction. A reasoning model's thinking is kept apart from the answer it
preceded (`reasoning`), and the app's own preferences (the thinking blocks folded or not) live here too. The
app commits the user's message before the answer is generated, the answer as it grows (`save_answer`, as
"interrupted" until it ends) and when it ends, so a crash or a kill mid-answer loses only its last seconds.
Several windows may share the file: ids are never reused (AUTOINCREMENT), and a message is appended only to the
conversation its window opened (`add_message`'s `created`), never to one that took a deleted one's place.
Export to Markdown and JSON lives here too: both read only what the database holds.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from localspec.errors import LocalspecError

log = logging.getLogger(__name__)

Provenance = list[tuple[str, bool]]
"""An answer's text as runs of (text, came from the draft)."""


class HistoryError(LocalspecError):
    """The chat database cannot be opened, is from a newer localspec, or has no such conversation."""


class ConversationGone(HistoryError):
    """The conversation a window appends to was deleted (in another window) since it was opened."""


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


MIGRATIONS: Sequence[Callable[[sqlite3.Connection], None]] = (
    _m001_conversations,
    _m002_thinking,
    _m003_ids_never_reused,
)
"""Schema steps; the database's user_version is how many have run. Append, never edit."""


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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


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


def _open_error(path: Path, error: Exception) -> str:
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
        try:
            with self.db:
                self.db.execute("BEGIN")
                return self.db.execute(sql, params)
        except sqlite3.Error as e:
            raise HistoryError(_write_error(self.path, e)) from e

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
        """Save a conversation and its messages in one transaction (a chat's first message, or a chat on screen
        whose saved copy another window deleted).

        Args:
            messages: each the keyword arguments of `add_message` (role, content, and any of its fields).

        Returns:
            (its id, its `created`, the messages' ids).

        Raises:
            HistoryError: the database cannot be written (then nothing of it is).
        """
        now = _now()
        try:
            with self.db:
                self.db.execute("BEGIN IMMEDIATE")
                cid = self.db.execute(
                    "INSERT INTO conversations (title, pair, system, created, updated, think)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (title, pair, system, now, now, think),
                ).lastrowid
                ids = [self._insert(cid, now, **message) for message in messages]
        except sqlite3.Error as e:
            raise HistoryError(_write_error(self.path, e)) from e
        return int(cid), now, ids

    def _insert(
        self,
        conversation_id: int,
        now: str,
        role: str,
        content: str,
        *,
        finish_reason: str | None = None,
        stats: dict | None = None,
        provenance: Provenance | None = None,
        reasoning: str = "",
        reasoning_provenance: Provenance | None = None,
    ) -> int:
        cur = self.db.execute(
            "INSERT INTO messages (conversation_id, role, content, created, finish_reason, stats, provenance,"
            " reasoning, reasoning_provenance) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                conversation_id,
                role,
                content,
                now,
                finish_reason,
                _json_or_none(stats),
                _json_or_none(provenance),
                reasoning,
                _json_or_none(reasoning_provenance),
            ),
        )
        return int(cur.lastrowid)

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        *,
        finish_reason: str | None = None,
        stats: dict | None = None,
        provenance: Provenance | None = None,
        reasoning: str = "",
        reasoning_provenance: Provenance | None = None,
        created: str | None = None,
    ) -> int:
        """Append a message and commit it; returns its id.

        Args:
            created: the conversation's `created` as the caller opened it: the message is added only if the
                conversation is still that one (another window may have deleted it).

        Raises:
            ConversationGone: no such conversation (or not the one created then).
            HistoryError: the database cannot be written (locked, full, read-only).
        """
        now = _now()
        try:
            with self.db:
                self.db.execute("BEGIN IMMEDIATE")  # the check and the insert see the same database
                if not self._holds(conversation_id, created):
                    raise ConversationGone(f"saved conversation {conversation_id} was deleted (in another window?)")
                message_id = self._insert(
                    conversation_id,
                    now,
                    role,
                    content,
                    finish_reason=finish_reason,
                    stats=stats,
                    provenance=provenance,
                    reasoning=reasoning,
                    reasoning_provenance=reasoning_provenance,
                )
                self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        except sqlite3.Error as e:
            raise HistoryError(_write_error(self.path, e)) from e
        return message_id

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
    ) -> None:
        """Rewrite a saved answer (one that grew since it was saved) and commit it.

        Raises:
            ConversationGone: the message or its conversation was deleted.
            HistoryError: the database cannot be written.
        """
        now = _now()
        try:
            with self.db:
                self.db.execute("BEGIN IMMEDIATE")
                cur = self.db.execute(
                    "UPDATE messages SET content = ?, finish_reason = ?, stats = ?, provenance = ?, reasoning = ?,"
                    " reasoning_provenance = ? WHERE id = ? AND conversation_id = ?",
                    (
                        content,
                        finish_reason,
                        _json_or_none(stats),
                        _json_or_none(provenance),
                        reasoning,
                        _json_or_none(reasoning_provenance),
                        message_id,
                        conversation_id,
                    ),
                )
                if cur.rowcount == 0:
                    raise ConversationGone(f"saved message {message_id} was deleted (in another window?)")
                self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        except sqlite3.Error as e:
            raise HistoryError(_write_error(self.path, e)) from e

    def _holds(self, conversation_id: int, created: str | None) -> bool:
        row = self.db.execute("SELECT created FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return row is not None and (created is None or row[0] == created)

    def delete_last_answer(self, conversation_id: int) -> bool:
        """Remove the conversation's last message if it is an answer (before regenerating it)."""
        row = self.db.execute(
            "SELECT id, role FROM messages WHERE conversation_id = ? ORDER BY id DESC LIMIT 1", (conversation_id,)
        ).fetchone()
        if row is None or row[1] != "assistant":
            return False
        self._write("DELETE FROM messages WHERE id = ?", (row[0],))
        return True

    def delete_message(self, conversation_id: int, message_id: int) -> None:
        """Remove one message (a user message that could not be answered)."""
        self._write("DELETE FROM messages WHERE id = ? AND conversation_id = ?", (message_id, conversation_id))

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
        value = _loads(row[0]) if row else None
        return default if value is None else value

    def set_preference(self, key: str, value) -> None:
        """Remember one of the app's preferences (a JSON value)."""
        self._write(
            "INSERT INTO preferences (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, _json_or_none(value)),
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
        """A conversation's messages in order."""
        rows = self.db.execute(
            "SELECT id, role, content, created, finish_reason, stats, provenance, reasoning, reasoning_provenance"
            " FROM messages WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        ).fetchall()
        return [
            StoredMessage(
                id=r[0],
                role=r[1],
                content=r[2],
                created=r[3],
                finish_reason=r[4],
                stats=_loads(r[5]),
                provenance=_provenance(_loads(r[6])),
                reasoning=r[7],
                reasoning_provenance=_provenance(_loads(r[8])),
            )
            for r in rows
        ]


def _write_error(path: Path, error: sqlite3.Error) -> str:
    """One line for a write that failed: a lock held by another process says who to wait for."""
    if "locked" in str(error) or "busy" in str(error):
        return (
            f"cannot save to the chat database {path}: another localspec holds it locked; try again in a "
            "moment (what you typed is kept)"
        )
    return f"cannot save to the chat database {path}: {error}"


def _json_or_none(value) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _loads(text: str | None):
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


# --- export ------------------------------------------------------------------------------------------------


def export_markdown(conversation: SavedConversation, messages: Sequence[StoredMessage]) -> str:
    """The conversation as a Markdown document: a title, the system prompt, then each message."""
    lines = [f"# {conversation.title}", "", f"*{conversation.created} · pair: {conversation.pair or '?'}*", ""]
    if conversation.system:
        lines += ["## System", "", conversation.system, ""]
    for message in messages:
        heading = "You" if message.role == "user" else "Assistant"
        if message.role == "assistant" and message.finish_reason == "cancelled":
            heading += " (stopped)"
        elif message.role == "assistant" and message.finish_reason == "interrupted":
            heading += " (cut short: the chat ended while writing it)"
        lines += [f"## {heading}", ""]
        if message.reasoning:  # the thinking, labelled and quoted, before the answer it led to
            lines += ["> **Thinking**", ">", *[f"> {line}".rstrip() for line in message.reasoning.splitlines()], ""]
        lines += [message.content, ""]
    return "\n".join(lines)


def export_json(conversation: SavedConversation, messages: Sequence[StoredMessage]) -> str:
    """The conversation as JSON: its fields, the system prompt and the messages with their stats."""
    data = {
        "id": conversation.id,
        "title": conversation.title,
        "pair": conversation.pair,
        "created": conversation.created,
        "updated": conversation.updated,
        "system": conversation.system,
        "messages": [
            {
                "role": m.role,
                "content": m.content,
                "reasoning": m.reasoning,
                "created": m.created,
                "finish_reason": m.finish_reason,
                "stats": m.stats,
            }
            for m in messages
        ],
    }
    return json.dumps(data, ensure_ascii=False, indent=2) + "\n"


def export_folder(configured: Path | None) -> Path:
    """Where exports go: the configured folder, else the working folder, else (it was deleted) the home folder."""
    if configured is not None:
        return Path(configured)
    try:
        return Path.cwd()
    except OSError:
        log.warning("the working folder is gone: exporting to the home folder")
        return Path.home()


def export_conversation(store: ChatStore, conversation_id: int, fmt: str, directory: Path) -> Path:
    """Write a conversation to `directory` as `chat-ID-TITLE.md` or `.json`; returns the file.

    Raises:
        HistoryError: unknown conversation or format, or the file cannot be written.
    """
    if fmt not in ("md", "json"):
        raise HistoryError(f"unknown export format {fmt!r}: use md or json")
    conversation = store.get(conversation_id)
    messages = store.messages(conversation_id)
    text = export_markdown(conversation, messages) if fmt == "md" else export_json(conversation, messages)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", conversation.title).strip("-").lower()[:40] or "untitled"
    path = Path(directory) / f"chat-{conversation.id}-{slug}.{fmt}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise HistoryError(f"cannot write {path}: {e.strerror or e}") from e
    return path
