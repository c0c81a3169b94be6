"""The chat database's schema: `MIGRATIONS`, a list of small functions applied in order by `migrate`.

The version is `PRAGMA user_version` (how many steps have run); each step runs in its own transaction, so a file is
always at one version, and a file from a newer localspec is refused. Steps are appended, never edited: a database
written by any earlier release opens with every chat kept. The messages form a tree (`parent_id`: an edited message
or a regenerated answer is a sibling of the one it replaces) and each conversation names the last message of the
branch on screen (`leaf_id`); an FTS5 index over the messages' text and their images' file names serves the search
across chats; an answer's tool calls and their results are a JSON column of it. Images are stored once each, by their
content hash (`images`, blobs), and a message names its own in order (`messages.images`, JSON), so a branch, an edit
and another chat that show the same picture share one row.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

from localspec.errors import HistoryError

log = logging.getLogger(__name__)

SEARCH_TABLE = "messages_fts"  # the FTS5 index of the messages (absent where SQLite was built without FTS5)
_FTS_OPTIONS = "content='messages', content_rowid='id', tokenize='unicode61 remove_diacritics 2'"
_V5_COLUMNS = f"content, {_FTS_OPTIONS}"  # the index as step 5 made it: the text alone
SEARCH_COLUMNS = f"content, image_names, {_FTS_OPTIONS}"  # since step 7: the text and its images' file names


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
    db.execute(f"CREATE VIRTUAL TABLE {SEARCH_TABLE} USING fts5({_V5_COLUMNS})")
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


def _m007_images(db: sqlite3.Connection) -> None:
    """Images: each stored once, by its content hash (`Image.id`, sha256 hex), as the bytes the user attached; a
    message names its own, in order, with the file name each was attached as (`images`: JSON [{id, name}]), and
    those names again as text for the search index (`image_names`), which is made anew with that column."""
    db.execute(
        "CREATE TABLE images (id TEXT PRIMARY KEY, data BLOB NOT NULL, format TEXT NOT NULL,"
        " width INTEGER NOT NULL, height INTEGER NOT NULL)"
    )
    db.execute("ALTER TABLE messages ADD COLUMN images TEXT")  # JSON: [{id, name}]; NULL: no image
    db.execute("ALTER TABLE messages ADD COLUMN image_names TEXT NOT NULL DEFAULT ''")  # one name a line
    if not has_search_index(db):
        return
    for trigger in ("insert", "delete", "update"):
        db.execute(f"DROP TRIGGER IF EXISTS messages_search_{trigger}")
    db.execute(f"DROP TABLE {SEARCH_TABLE}")
    db.execute(f"CREATE VIRTUAL TABLE {SEARCH_TABLE} USING fts5({SEARCH_COLUMNS})")
    columns = "content, image_names"
    add = f"INSERT INTO {SEARCH_TABLE} (rowid, {columns}) VALUES (new.id, new.content, new.image_names);"
    drop = (
        f"INSERT INTO {SEARCH_TABLE} ({SEARCH_TABLE}, rowid, {columns})"
        " VALUES ('delete', old.id, old.content, old.image_names);"
    )
    db.execute(f"CREATE TRIGGER messages_search_insert AFTER INSERT ON messages BEGIN {add} END")
    db.execute(f"CREATE TRIGGER messages_search_delete AFTER DELETE ON messages BEGIN {drop} END")
    db.execute(f"CREATE TRIGGER messages_search_update AFTER UPDATE OF {columns} ON messages BEGIN {drop} {add} END")
    db.execute(f"INSERT INTO {SEARCH_TABLE} ({SEARCH_TABLE}) VALUES ('rebuild')")


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
    _m007_images,
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
