"""The chat history database: schema migrations, saving and reading conversations, export."""

from __future__ import annotations

import json
import sqlite3

import pytest

from localspec.tui.store import MIGRATIONS, ChatStore, HistoryError, export_conversation, migrate


def test_new_database_is_at_the_latest_version_in_wal_mode(store):
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_migrations_run_once_in_order(tmp_path):
    calls = []

    def add_table(db):
        calls.append("tags")
        db.execute("CREATE TABLE tags (name TEXT)")

    path = tmp_path / "chats.sqlite3"
    ChatStore(path).close()
    steps = (*MIGRATIONS, add_table)
    ChatStore(path, migrations=steps).close()
    ChatStore(path, migrations=steps).close()
    assert calls == ["tags"]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == len(steps)


def test_a_failed_migration_leaves_the_old_version(tmp_path):
    def broken(db):
        db.execute("CREATE TABLE half (x)")
        raise sqlite3.OperationalError("boom")

    path = tmp_path / "chats.sqlite3"
    ChatStore(path).close()
    with pytest.raises(HistoryError, match="cannot open"):
        ChatStore(path, migrations=(*MIGRATIONS, broken))
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'half'").fetchone() is None


def test_a_newer_database_is_refused_with_one_line(tmp_path):
    path = tmp_path / "chats.sqlite3"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(HistoryError, match="upgrade localspec"):
        ChatStore(path)


def test_not_a_database_is_one_line(tmp_path):
    path = tmp_path / "chats.sqlite3"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(HistoryError, match="move it away"):
        ChatStore(path)


def test_messages_round_trip_with_stats_and_provenance(store):
    cid = store.create_conversation("Hello", pair="demo", system="be brief")
    store.add_message(cid, "user", "hi")
    store.add_message(
        cid,
        "assistant",
        "hello there",
        finish_reason="stop",
        stats={"acceptance_rate": 0.5},
        provenance=[("hello", True), (" there", False)],
    )
    messages = store.messages(cid)
    assert [(m.role, m.content) for m in messages] == [("user", "hi"), ("assistant", "hello there")]
    assert messages[1].stats == {"acceptance_rate": 0.5}
    assert messages[1].provenance == [("hello", True), (" there", False)]
    assert messages[1].finish_reason == "stop"
    conv = store.get(cid)
    assert (conv.title, conv.pair, conv.system, conv.n_messages) == ("Hello", "demo", "be brief", 2)


def test_rename_delete_and_order(store):
    first = store.create_conversation("first")
    second = store.create_conversation("second")
    store.add_message(first, "user", "newer now")
    assert [c.id for c in store.conversations()][0] == first
    store.rename(second, "renamed")
    assert store.get(second).title == "renamed"
    store.delete(first)
    assert [c.id for c in store.conversations()] == [second]
    assert store.messages(first) == []
    with pytest.raises(HistoryError, match="no saved conversation"):
        store.get(first)


def test_delete_last_answer_only_removes_an_answer(store):
    cid = store.create_conversation("c")
    store.add_message(cid, "user", "q")
    assert not store.delete_last_answer(cid)
    store.add_message(cid, "assistant", "a")
    assert store.delete_last_answer(cid)
    assert [m.role for m in store.messages(cid)] == ["user"]


def test_committed_messages_survive_a_second_connection(tmp_path):
    path = tmp_path / "chats.sqlite3"
    writer = ChatStore(path)
    cid = writer.create_conversation("c")
    writer.add_message(cid, "user", "sent before the crash")
    reader = ChatStore(path)  # the writer is never closed: like a process killed mid-answer
    assert [m.content for m in reader.messages(cid)] == ["sent before the crash"]
    reader.close()
    writer.close()


def test_export_markdown_and_json(store, tmp_path):
    cid = store.create_conversation("Code & stuff!", pair="demo", system="sys")
    store.add_message(cid, "user", "write code")
    store.add_message(cid, "assistant", "```py\nprint(1)\n```", finish_reason="cancelled", stats={"emitted": 3})
    md = export_conversation(store, cid, "md", tmp_path / "out")
    assert md.name == f"chat-{cid}-code-stuff.md"
    text = md.read_text()
    assert "# Code & stuff!" in text and "## System" in text and "## Assistant (stopped)" in text
    assert "```py\nprint(1)\n```" in text
    data = json.loads(export_conversation(store, cid, "json", tmp_path / "out").read_text())
    assert data["system"] == "sys"
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert data["messages"][1]["stats"] == {"emitted": 3}
    with pytest.raises(HistoryError, match="unknown export format"):
        export_conversation(store, cid, "pdf", tmp_path)


def test_migrate_is_idempotent(tmp_path):
    db = sqlite3.connect(tmp_path / "x.sqlite3", isolation_level=None)
    assert migrate(db) == len(MIGRATIONS)
    assert migrate(db) == len(MIGRATIONS)


def test_the_thinking_migration_keeps_every_chat_of_the_schema_before_it(tmp_path):
    path = tmp_path / "chats.sqlite3"
    old = ChatStore(path, migrations=MIGRATIONS[:1])  # the schema as it was before reasoning models
    assert old.db.execute("PRAGMA user_version").fetchone()[0] == 1
    first = old.create_conversation("first", pair="demo", system="be brief")
    second = old.create_conversation("second")
    insert = (  # what the code of that schema wrote (add_message now writes the new columns too)
        "INSERT INTO messages (conversation_id, role, content, created, finish_reason, stats, provenance)"
        " VALUES (?, ?, ?, '2025-01-01T00:00:00+00:00', ?, ?, ?)"
    )
    with old.db:
        old.db.execute(insert, (first, "user", "hi", None, None, None))
        old.db.execute(
            insert, (first, "assistant", "hello", "stop", '{"emitted": 2}', '[["hel", true], ["lo", false]]')
        )
        old.db.execute(insert, (second, "user", "<think>typed</think> by the user", None, None, None))
    chats_before = old.db.execute("SELECT * FROM conversations ORDER BY id").fetchall()
    rows_before = old.db.execute("SELECT * FROM messages ORDER BY id").fetchall()
    old.close()

    store = ChatStore(path)  # migrates
    try:
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) == 2
        chats_after = store.db.execute("SELECT * FROM conversations ORDER BY id").fetchall()
        assert [row[: len(chats_before[0])] for row in chats_after] == chats_before
        assert [(c.title, c.n_messages, c.think) for c in store.conversations()] == [
            ("second", 1, None),
            ("first", 2, None),
        ]
        rows_after = store.db.execute("SELECT * FROM messages ORDER BY id").fetchall()
        assert [row[: len(rows_before[0])] for row in rows_after] == rows_before  # every old column as it was
        hello = store.messages(first)[1]
        assert (hello.content, hello.reasoning, hello.reasoning_provenance) == ("hello", "", None)
        assert hello.stats == {"emitted": 2} and hello.provenance == [("hel", True), ("lo", False)]
        assert store.messages(second)[0].content == "<think>typed</think> by the user"  # user text is not split
        assert store.preference("thinking_expanded", False) is False
    finally:
        store.close()


def test_thinking_is_stored_apart_and_preferences_and_the_chats_switch_are_kept(store):
    cid = store.create_conversation("reasoning")
    store.add_message(cid, "user", "hi")
    store.add_message(
        cid,
        "assistant",
        "Hello world!",
        reasoning="We must give them\na kind word first.",
        reasoning_provenance=[("We must", True), (" give them", False)],
    )
    answer = store.messages(cid)[1]
    assert (answer.content, answer.reasoning) == ("Hello world!", "We must give them\na kind word first.")
    assert answer.reasoning_provenance == [("We must", True), (" give them", False)]
    store.set_think(cid, False)
    assert store.get(cid).think is False
    store.set_think(cid, None)
    assert store.get(cid).think is None
    store.set_preference("thinking_expanded", True)
    store.set_preference("thinking_expanded", False)
    assert store.preference("thinking_expanded") is False
    assert store.preference("never set", "default") == "default"


def test_exports_label_the_thinking(store, tmp_path):
    cid = store.create_conversation("Think")
    store.add_message(cid, "user", "hi")
    store.add_message(cid, "assistant", "Hello world!", reasoning="We must give them\na kind word first.")
    store.add_message(cid, "user", "again")
    store.add_message(cid, "assistant", "no thinking here")
    text = export_conversation(store, cid, "md", tmp_path).read_text()
    assert "## Assistant\n\n> **Thinking**\n>\n> We must give them\n> a kind word first.\n\nHello world!\n" in text
    assert text.count("**Thinking**") == 1
    data = json.loads(export_conversation(store, cid, "json", tmp_path).read_text())
    assert [m["reasoning"] for m in data["messages"]] == ["", "We must give them\na kind word first.", "", ""]
    assert data["messages"][1]["content"] == "Hello world!"
