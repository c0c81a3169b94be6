"""The chat history database: schema migrations, saving and reading conversations, export."""

from __future__ import annotations

import json
import sqlite3

import pytest
from support import store_v3

from localspec.tui.export import export_conversation
from localspec.tui.store import MIGRATIONS, ChatStore, ConversationGone, HistoryError, migrate


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
    old = store_v3.ChatStore(path, migrations=store_v3.MIGRATIONS[:1])  # the schema before reasoning models
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
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) == 7
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


# --- two windows on one file (issue 44) --------------------------------------------------------------------------


def test_two_stores_on_one_file_never_reuse_the_id_of_a_deleted_chat(tmp_path):
    path = tmp_path / "chats.sqlite3"
    a, b = ChatStore(path), ChatStore(path)  # two chat windows on one data folder
    try:
        alice = a.create_conversation("Alice's chat")
        a.add_message(alice, "user", "Alice: hello")
        b.delete(alice)  # the newest chat, deleted in the other window
        bob = b.create_conversation("Bob's chat")
        assert bob != alice
        message = b.add_message(bob, "user", "Bob: hi")
        b.delete_message(bob, message)
        assert b.add_message(bob, "user", "Bob: hi again") != message  # message ids are not reused either
    finally:
        a.close()
        b.close()


def test_a_message_goes_only_to_the_conversation_its_window_opened(tmp_path):
    path = tmp_path / "chats.sqlite3"
    a, b = ChatStore(path), ChatStore(path)
    try:
        alice = a.create_conversation("Alice's chat")
        created = a.get(alice).created
        a.add_message(alice, "user", "Alice: hello", created=created)
        b.delete(alice)
        with pytest.raises(ConversationGone, match="deleted"):
            a.add_message(alice, "user", "Alice: are you there?", created=created)
        # A database moved away and started afresh reuses ids: the creation time tells the chats apart.
        b.db.execute("DELETE FROM sqlite_sequence")
        bob = b.create_conversation("Bob's chat")
        assert bob == alice and b.get(bob).created != created
        with pytest.raises(ConversationGone):
            a.add_message(bob, "user", "Alice: still me", created=created)
        assert [m.content for m in b.messages(bob)] == []
    finally:
        a.close()
        b.close()


def test_a_growing_answer_is_rewritten_in_place_and_a_deleted_one_is_said(store):
    cid = store.create_conversation("chat")
    store.add_message(cid, "user", "hi")
    answer = store.add_message(cid, "assistant", "Hel", finish_reason="interrupted", provenance=[("Hel", True)])
    store.update_message(cid, answer, "Hello world", finish_reason="stop", stats={"emitted": 3})
    [_, saved] = store.messages(cid)
    assert (saved.id, saved.content, saved.finish_reason) == (answer, "Hello world", "stop")
    assert saved.stats == {"emitted": 3}
    store.delete(cid)
    with pytest.raises(ConversationGone):
        store.update_message(cid, answer, "Hello world!")


def test_a_database_locked_by_another_process_is_one_line_that_says_so(tmp_path):
    path = tmp_path / "chats.sqlite3"
    store = ChatStore(path)
    cid = store.create_conversation("chat")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    store.db.execute("PRAGMA busy_timeout = 50")
    try:
        with pytest.raises(HistoryError, match="locked") as caught:
            store.add_message(cid, "user", "hello")
        assert "\n" not in str(caught.value) and "kept" in str(caught.value)
    finally:
        other.execute("ROLLBACK")
        other.close()
        store.close()


def test_the_ids_migration_keeps_every_chat_of_the_schema_before_it(tmp_path):
    path = tmp_path / "chats.sqlite3"
    old = store_v3.ChatStore(path, migrations=store_v3.MIGRATIONS[:2])  # the release before ids were kept apart
    ids = [old.create_conversation(title, pair="demo", system="be brief") for title in ("one", "two", "three")]
    for cid in ids:
        old.add_message(cid, "user", f"question {cid}")
        old.add_message(
            cid,
            "assistant",
            f"answer {cid}",
            finish_reason="stop",
            stats={"emitted": 2},
            provenance=[("answer", True)],
            reasoning="hmm",
            reasoning_provenance=[("hmm", False)],
        )
    old.set_think(ids[1], True)
    old.set_preference("thinking_expanded", True)
    chats_before = old.db.execute("SELECT * FROM conversations ORDER BY id").fetchall()
    rows_before = old.db.execute("SELECT * FROM messages ORDER BY id").fetchall()
    old.close()

    store = ChatStore(path)  # migrates
    try:
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) == 7
        chats_after = store.db.execute("SELECT * FROM conversations ORDER BY id").fetchall()
        assert [row[: len(chats_before[0])] for row in chats_after] == chats_before  # every old column as it was
        rows_after = store.db.execute("SELECT * FROM messages ORDER BY id").fetchall()
        assert [row[: len(rows_before[0])] for row in rows_after] == rows_before
        assert store.db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert store.preference("thinking_expanded") is True and store.get(ids[1]).think is True
        store.delete(ids[-1])  # the newest: its id must not come back
        assert store.create_conversation("four") > ids[-1]
        store.delete(ids[0])  # and the cascade still holds
        assert store.db.execute("SELECT COUNT(*) FROM messages WHERE conversation_id = ?", (ids[0],)).fetchone() == (0,)
    finally:
        store.close()
