"""The chat database as a tree, searched and remembered (issue 48): the schema steps on a database written by the
store of the release before them (`support.store_v3`, today's main frozen), the branches, the exports, the FTS5
search with any characters, the LIKE search without FTS5, and the prompts ↑ walks through."""

from __future__ import annotations

import json
import sqlite3

import pytest
from support import store_v3

from localspec.tui.export import export_conversation
from localspec.tui.schema import SEARCH_TABLE
from localspec.tui.search import MARK, PromptHistory, fts_query, prompts, search
from localspec.tui.store import MIGRATIONS, ChatStore, HistoryError


def v3_database(path):
    """Three chats as today's main writes them: with thinking, a stopped answer, a deleted chat between them, the
    thinking switch and a preference; returns (their ids, every row of both tables)."""
    old = store_v3.ChatStore(path)
    assert old.db.execute("PRAGMA user_version").fetchone()[0] == 3
    first, _, _ = old.save_copy("Speculation", [{"role": "user", "content": "What is speculative decoding?"}])
    old.add_message(
        first,
        "assistant",
        "A draft proposes tokens; the target verifies them.",
        finish_reason="stop",
        stats={"emitted": 9},
        provenance=[("A draft", True), (" proposes tokens; the target verifies them.", False)],
        reasoning="They ask about decoding.",
        reasoning_provenance=[("They ask about decoding.", True)],
    )
    old.add_message(first, "user", "And the acceptance rate?")
    old.add_message(first, "assistant", "It depends on the draft", finish_reason="cancelled")
    gone = old.create_conversation("deleted")
    old.add_message(gone, "user", "never mind")
    old._write("DELETE FROM conversations WHERE id = ?", (gone,))
    second = old.create_conversation("Zebras", pair="demo", system="be brief")
    old.add_message(second, "user", "Tell me about zebras (stripes?)")
    old.set_think(second, True)
    old.set_preference("thinking_expanded", True)
    empty = old.create_conversation("nothing yet")
    rows = {t: old.db.execute(f"SELECT * FROM {t} ORDER BY id").fetchall() for t in ("conversations", "messages")}
    old.close()
    return (first, second, empty), rows


def test_a_database_of_todays_main_opens_with_every_chat_intact(tmp_path):
    path = tmp_path / "chats.sqlite3"
    (first, second, empty), before = v3_database(path)
    store = ChatStore(path)
    try:
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) == 7
        for table, rows in before.items():
            after = store.db.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()
            assert [row[: len(rows[0])] for row in after] == rows  # every old column of every row as it was
        chat = store.messages(first)
        assert [m.content for m in chat] == [row[3] for row in before["messages"] if row[1] == first]
        assert [m.parent_id for m in chat] == [None, chat[0].id, chat[1].id, chat[2].id]  # one branch, in order
        assert all(m.branch == (1, 1) for m in chat)
        assert chat[1].reasoning == "They ask about decoding." and chat[1].provenance[0] == ("A draft", True)
        assert chat[3].finish_reason == "cancelled" and store.messages(empty) == []
        assert store.get(second).think is True and store.preference("thinking_expanded") is True
        assert [c.title for c in store.conversations()] == ["nothing yet", "Zebras", "Speculation"]
        # the chats go on: a new message follows the last one, and every old message is found by search
        store.add_message(first, "user", "Thanks")
        assert store.messages(first)[-1].parent_id == chat[-1].id
        assert [h.message_id for h in search(store, "verifies")] == [chat[1].id]
        assert [h.conversation_id for h in search(store, "zebra")] == [second]  # the last word is a prefix
        assert prompts(store)[:2] == ["Thanks", "Tell me about zebras (stripes?)"]
        assert store.db.execute(f"INSERT INTO {SEARCH_TABLE} ({SEARCH_TABLE}) VALUES ('integrity-check')")
    finally:
        store.close()


def test_an_edit_is_a_sibling_and_the_branch_on_screen_is_what_the_store_shows(store):
    cid = store.create_conversation("c")
    q1 = store.add_message(cid, "user", "one")
    a1 = store.add_message(cid, "assistant", "answer one")
    q2 = store.add_message(cid, "user", "two")
    a2 = store.add_message(cid, "assistant", "answer two")
    edited = store.add_message(cid, "user", "two, edited", parent_id=a1)  # an edit of q2: its sibling
    a3 = store.add_message(cid, "assistant", "answer to the edit")
    shown = store.messages(cid)
    assert [m.id for m in shown] == [q1, a1, edited, a3]
    assert [m.branch for m in shown] == [(1, 1), (1, 1), (2, 2), (1, 1)]
    assert store.switch(cid, edited, -1) and [m.id for m in store.messages(cid)] == [q1, a1, q2, a2]
    assert not store.switch(cid, q2, -1)  # nothing before the first sibling
    assert store.switch(cid, q2, 1) and store.messages(cid)[-1].id == a3  # back: the branch goes on to its end
    store.show(cid, a2)  # a search hit on the other branch
    assert [m.id for m in store.messages(cid)] == [q1, a1, q2, a2]
    again = store.add_message(cid, "assistant", "answer two, again", parent_id=q2)  # an answer generated again
    assert store.messages(cid)[-1].branch == (2, 2) and store.branches(cid)[a2] == (1, 2)
    store.delete_message(cid, again)  # it could not be answered: the branch ends at its question
    assert [m.id for m in store.messages(cid)] == [q1, a1, q2]
    assert len(store.tree(cid)) == 6


def test_the_markdown_export_writes_the_branch_on_screen_and_the_json_the_whole_tree(store, tmp_path):
    cid = store.create_conversation("Branches")
    q = store.add_message(cid, "user", "first version")
    store.add_message(cid, "assistant", "old answer")
    store.add_message(cid, "user", "second version", parent_id=None)
    store.add_message(cid, "assistant", "new answer")
    md = export_conversation(store, cid, "md", tmp_path).read_text()
    assert "second version" in md and "new answer" in md and "## You (branch 2/2)" in md
    assert "first version" not in md and "old answer" not in md
    data = json.loads(export_conversation(store, cid, "json", tmp_path).read_text())
    assert [m["content"] for m in data["messages"]] == ["first version", "old answer", "second version", "new answer"]
    ids = [m["id"] for m in data["messages"]]
    assert [m["parent_id"] for m in data["messages"]] == [None, q, None, ids[2]]
    assert data["branch"] == ids[2:]


@pytest.mark.parametrize(
    "query",
    ['"', "*", "-", "speculative -", 'NEAR("a" "b")', "a:b", "(", ")", "'", "^", "AND", "OR NOT", "\\", "%_", "", "  "],
)
def test_fts5_syntax_in_a_search_is_text_never_an_error(store, query):
    cid = store.create_conversation("c")
    store.add_message(cid, "user", "speculative decoding AND the NEAR future: a:b (or not)")
    hits = search(store, query)
    assert isinstance(hits, list)
    words = [w for w in ("speculative", "AND", "NEAR", "a", "b", "OR", "NOT") if w in query]
    if words:
        assert len(hits) == 1


def test_search_finds_every_chat_marks_the_words_and_follows_edits_and_deletes(store):
    one = store.create_conversation("one")
    store.add_message(one, "user", "The quick brown fox jumps over the lazy dog")
    two = store.create_conversation("two")
    answer = store.add_message(two, "assistant", "Foxes are quick")
    assert fts_query('quick "fox') == '"quick" "fox"*'
    hits = search(store, "quick fox")
    assert {h.conversation_id for h in hits} == {one, two}
    assert all(f"{MARK[0]}quick{MARK[1]}".lower() in h.snippet.lower() for h in hits)
    store.update_message(two, answer, "Foxes are slow")  # an answer rewritten as it grows is indexed anew
    assert [h.conversation_id for h in search(store, "quick")] == [one]
    store.delete(one)
    assert search(store, "quick") == [] and search(store, "FOXES")[0].message_id == answer


def test_without_fts5_search_reads_every_message_and_finds_the_same(store):
    cid = store.create_conversation("c")
    store.add_message(cid, "user", "a 100% sure_thing about Zebras")
    store.db.execute(f"DROP TABLE {SEARCH_TABLE}")  # as on a SQLite built without FTS5 (the step then adds none)
    for name in ("insert", "delete", "update"):
        store.db.execute(f"DROP TRIGGER IF EXISTS messages_search_{name}")
    [hit] = search(store, "zebras sure_thing")
    assert f"{MARK[0]}Zebras{MARK[1]}" in hit.snippet and search(store, "100 %") and not search(store, "x%")


def test_prompts_are_walked_newest_first_each_once_and_kept_across_runs(tmp_path):
    path = tmp_path / "chats.sqlite3"
    store = ChatStore(path)
    cid = store.create_conversation("c")
    for text in ("first", "second", "first", "third"):
        store.add_message(cid, "user", text)
        store.add_message(cid, "assistant", f"answer to {text}")
    store.close()
    store = ChatStore(path)  # a new run
    try:
        walk = PromptHistory(store)
        assert walk.step(False, fresh=True) is None  # ↓ in an empty box: nothing
        assert [walk.step(True, fresh=True)] + [walk.step(True, fresh=False) for _ in range(3)] == [
            "third",
            "first",
            "second",
            None,  # no older prompt: the box keeps the oldest
        ]
        assert walk.step(False, fresh=False) == "first" and walk.step(False, fresh=False) == "third"
        assert walk.step(False, fresh=False) == "" and walk.step(False, fresh=False) is None
        store.add_message(cid, "user", "fourth")
        assert walk.step(True, fresh=True) == "fourth"  # a new walk reads the prompts again
    finally:
        store.close()


def test_a_migration_step_that_fails_keeps_the_database_of_todays_main(tmp_path):
    path = tmp_path / "chats.sqlite3"
    _, before = v3_database(path)

    def broken(db):
        db.execute("CREATE TABLE half (x)")
        raise sqlite3.OperationalError("boom")

    with pytest.raises(Exception, match="cannot open"):
        ChatStore(path, migrations=(*MIGRATIONS[:4], broken))
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 4  # the tree step stayed, the broken one did not
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'half'").fetchone() is None
    db.close()
    store = ChatStore(path)
    try:
        assert len(store.tree(1)) == len([r for r in before["messages"] if r[1] == 1])
        assert search(store, "zebras")
    finally:
        store.close()


# How a real file's search index is found damaged: each breaks a different part of FTS5's shadow tables, as a disk
# error or a torn copy of the file would, and each once ended a search in a bare SQLite error that said nothing of the
# fix — or, for the structure, the config or a lost table, failed every save of a message too.
INDEX_DAMAGE = {
    "leaf pages": f"UPDATE {SEARCH_TABLE}_data SET block = substr(block, 1, 5) WHERE id > 10",
    "structure": f"DELETE FROM {SEARCH_TABLE}_data WHERE id = 10",
    "config": f"DELETE FROM {SEARCH_TABLE}_config",  # FTS5 says "run 'rebuild'", and its 'rebuild' fails
    "a table lost": f"DROP TABLE {SEARCH_TABLE}_idx",
}


def chats_with_a_damaged_index(path, damage: str) -> list[int]:
    """Two chats saved and closed, then the index damaged by another connection; returns the messages' ids."""
    store = ChatStore(path)
    cid = store.create_conversation("zoo")
    ids = [store.add_message(cid, "user", f"zebras number {i} and giraffes") for i in range(30)]
    ids.append(store.add_message(cid, "assistant", "Stripes, mostly."))
    store.close()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(damage)
    db.close()
    return ids


@pytest.mark.parametrize("damage", INDEX_DAMAGE.values(), ids=INDEX_DAMAGE.keys())
def test_a_damaged_search_index_is_rebuilt_and_the_search_finds_every_message(tmp_path, damage):
    path = tmp_path / "chats.sqlite3"
    ids = chats_with_a_damaged_index(path, damage)
    store = ChatStore(path)
    try:
        assert sorted(h.message_id for h in search(store, "zebras giraffes")) == ids[:30]
        assert [h.message_id for h in search(store, "stripes")] == [ids[30]]
        new = store.add_message(1, "user", "okapis too")  # the index keeps following the messages
        assert [h.message_id for h in search(store, "okapi")] == [new]
        store.db.execute(f"INSERT INTO {SEARCH_TABLE} ({SEARCH_TABLE}) VALUES ('integrity-check')")
        assert store.db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        store.close()


@pytest.mark.parametrize("damage", INDEX_DAMAGE.keys())
def test_a_damaged_search_index_costs_no_message_when_saving(tmp_path, damage):
    path = tmp_path / "chats.sqlite3"
    chats_with_a_damaged_index(path, INDEX_DAMAGE[damage])
    store = ChatStore(path)
    try:
        new = store.add_message(1, "user", "saved all the same")  # the index's triggers failed every save
        cid, _, _ = store.save_copy("new chat", [{"role": "user", "content": "a first message"}])
        assert store.messages(1)[-1].id == new and store.messages(cid)[0].content == "a first message"
        assert [h.message_id for h in search(store, "same")] == [new]
    finally:
        store.close()


def test_an_index_that_cannot_be_rebuilt_is_one_line_that_says_what_to_do(tmp_path):
    """The messages' own pages damaged too: rebuilding reads them and fails; the line names the file's recovery."""
    path = tmp_path / "chats.sqlite3"
    chats_with_a_damaged_index(path, INDEX_DAMAGE["leaf pages"])
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page = db.execute("PRAGMA page_size").fetchone()[0]
    root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages'").fetchone()[0]
    db.close()
    with path.open("r+b") as f:  # the messages' first page: garbage, as a bad sector would leave it
        f.seek((root - 1) * page)
        f.write(b"\xa5" * page)
    store = ChatStore(path)
    try:
        with pytest.raises(HistoryError) as caught:
            search(store, "zebras")
        line = str(caught.value)
        assert "\n" not in line and "search index is damaged" in line and f"sqlite3 {path} .recover" in line
    finally:
        store.close()
