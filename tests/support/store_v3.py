"""Today's chat store, frozen at commit d9cb33e (schema version 3): it writes databases as that release did.

Migration tests open a database this module wrote with the current `ChatStore` and check that every chat is
intact. Only what writes is kept (its three schema steps, `migrate`, and the writing methods), verbatim.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

Provenance = list[tuple[str, bool]]


class HistoryError(Exception):
    """The frozen store's errors."""


class ConversationGone(HistoryError):
    """The frozen store's errors."""


def _write_error(path: Path, error: sqlite3.Error) -> str:
    return f"cannot save to the chat database {path}: {error}"


def _open_error(path: Path, error: Exception) -> str:
    return f"cannot open the chat database {path}: {error}"


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
    finally:
        db.execute(f"PRAGMA foreign_keys = {int(foreign_keys)}")
    return len(migrations)


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

    def set_think(self, conversation_id: int, think: bool | None) -> None:
        """Record the conversation's thinking switch (None: the pair's default)."""
        self._write("UPDATE conversations SET think = ? WHERE id = ?", (think, conversation_id))

    def set_preference(self, key: str, value) -> None:
        """Remember one of the app's preferences (a JSON value)."""
        self._write(
            "INSERT INTO preferences (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, _json_or_none(value)),
        )

    def _holds(self, conversation_id: int, created: str | None) -> bool:
        row = self.db.execute("SELECT created FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return row is not None and (created is None or row[0] == created)


def _json_or_none(value) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
