"""The chat app's `Conversation` without Textual: the real engine on the tiny pair and a real SQLite store.

Turns run as the app runs them, minus the worker thread: `send` (or `regenerate`), then `Turn.begin` and
`stream_generation` to its `Finished`, then `finish`. Each test checks the three places the conversation
shows up — `messages`, the session the engine renders, and the database — agree.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import subprocess
import sys

import pytest
from support.tui import PAIR_SETTINGS, roles, saved

from localspec.core.engine import Engine
from localspec.core.session import Message
from localspec.errors import ContextError, InvalidParamsError, LocalspecError
from localspec.models.resolved import ResolvedPair
from localspec.tui.conversation import RESAVED, SAVE_EVERY, Conversation, Phase, Turn
from localspec.tui.live import Chunk, Finished, stream_generation
from localspec.tui.loading import Loaded
from localspec.tui.settings import ChatOptions
from localspec.tui.store import ChatStore


@pytest.fixture
def options():
    return ChatOptions(max_tokens=16, overrides={"seed": 1, "adaptive": False})


def load(tiny_models, pair: str = "tiny", *, draft=None, target=None, n_ctx: int = 1024) -> Loaded:
    target = target or tiny_models.target
    draft = draft or tiny_models.draft_noisy
    engine = Engine.load(target, draft, n_ctx=n_ctx)
    return Loaded(engine, ResolvedPair(target, draft, pair, pair, PAIR_SETTINGS), "model")


@pytest.fixture
def conversation(tiny_models, options, store):
    conv = Conversation(options, store)
    conv.begin_load()
    conv.attach(load(tiny_models))
    yield conv
    engine = conv.detach()
    if engine is not None:
        engine.close()


def run(turn: Turn) -> Finished:
    """What the app's worker does with a turn, on this thread."""
    done: list[Finished] = []
    stream_generation(turn.begin(), lambda item: done.append(item) if isinstance(item, Finished) else None)
    [finished] = done
    return finished


@pytest.mark.slow
def test_a_turn_is_saved_before_and_after_and_only_the_conversation_writes_the_messages(conversation):
    conv = conversation
    assert conv.phase is Phase.READY and conv.session.messages == []
    turn = conv.send("Hello there")
    assert conv.phase is Phase.GENERATING and conv.turn is turn
    assert conv.busy("send another message").startswith("an answer is being generated")
    assert saved(conv) == [("user", "Hello there")]  # committed before the answer exists
    assert conv.store.get(conv.saved_id).title == "Hello there" and conv.store.get(conv.saved_id).pair == "tiny"
    finished = run(turn)
    assert roles(conv) == ["user"]  # the worker's generation wrote nothing: the answer is handed over
    conv.finish(finished)
    assert conv.phase is Phase.READY and conv.turn is None and conv.busy("x") is None
    assert roles(conv) == ["user", "assistant"] and conv.messages[-1].content == finished.text
    assert saved(conv) == [("user", "Hello there"), ("assistant", finished.text)]
    [_, answer] = conv.store.messages(conv.saved_id)
    assert answer.finish_reason == "length" and answer.stats["emitted"] == 16
    assert conv.answers == 1 and conv.session_stats.emitted == 16 and conv.last_turn.emitted == 16


def test_a_reload_swaps_the_session_and_keeps_the_conversation(conversation, tiny_models):
    conv = conversation
    conv.finish(run(conv.send("Hello")))
    before = list(conv.messages)
    old = conv.begin_load()
    assert old is not None and conv.phase is Phase.LOADING and conv.session is None and conv.loaded is None
    assert conv.busy("switch pairs") == "the models are still loading"
    assert conv.answers == 0 and conv.last_turn is None  # the numbers belong to the models that made them
    assert conv.messages == before  # nothing was lost while no session exists
    old.close()
    with pytest.raises(ContextError, match="no model is loaded"):
        conv.send("too early")
    conv.attach(load(tiny_models, "tiny-same", draft=tiny_models.draft_same))
    assert conv.phase is Phase.READY and conv.session.messages == [] and conv.messages == before
    assert conv.store.get(conv.saved_id).pair == "tiny-same"
    finished = run(conv.send("Once more"))
    conv.finish(finished)
    assert finished.stats.drafted > 0 and finished.stats.accepted == finished.stats.drafted  # identical draft
    assert roles(conv) == ["user", "assistant", "user", "assistant"]
    assert [r for r, _ in saved(conv)] == roles(conv)


def test_a_drafter_change_brings_its_settings_and_a_failed_load_forgets_them(conversation, tiny_models):
    conv = conversation
    wanted = dataclasses.replace(conv.settings, drafter="none", max_tokens=7)
    conv.begin_load(wanted).close()
    conv.load_failed()
    assert conv.phase is Phase.NO_MODEL
    conv.begin_load()
    conv.attach(load(tiny_models))
    assert conv.settings.drafter == "model" and conv.settings.max_tokens == 16  # the pair's, not `wanted`
    conv.begin_load(wanted).close()
    conv.attach(load(tiny_models))
    assert conv.settings == wanted


@pytest.mark.slow
def test_the_system_prompt_is_the_first_message_here_in_the_session_and_saved(conversation):
    conv = conversation
    conv.set_system("  You are terse.  ")
    assert conv.system == "You are terse." and conv.messages == [Message("system", "You are terse.")]
    conv.finish(run(conv.send("Hi")))
    assert roles(conv) == ["system", "user", "assistant"] and conv.session.messages == []
    assert conv.store.get(conv.saved_id).system == "You are terse."
    assert [m.role for m in conv.dialogue] == ["user", "assistant"]
    conv.set_system("")
    assert conv.system == "" and roles(conv) == ["user", "assistant"]
    assert conv.store.get(conv.saved_id).system == ""
    conv.set_system("Be kind.")
    conv.new()
    assert conv.messages == [Message("system", "Be kind.")] and conv.saved_id is None and conv.answers == 0
    assert conv.session.messages == []


def test_a_saved_conversation_is_opened_with_its_system_prompt_and_continued(conversation, store):
    cid = store.create_conversation("old chat", pair="elsewhere", system="Answer in French.")
    store.add_message(cid, "user", "Bonjour")
    store.add_message(cid, "assistant", "Salut")
    conv = conversation
    conv.finish(run(conv.send("something else first")))
    saved_conv, stored = conv.open(cid)
    assert saved_conv.title == "old chat" and [m.content for m in stored] == ["Bonjour", "Salut"]
    assert conv.saved_id == cid and conv.system == "Answer in French." and conv.answers == 0
    assert conv.messages == [
        Message("system", "Answer in French."),
        Message("user", "Bonjour"),
        Message("assistant", "Salut"),
    ]
    assert conv.session.messages == []
    finished = run(conv.send("Encore"))
    conv.finish(finished)
    assert [c for _, c in saved(conv)] == ["Bonjour", "Salut", "Encore", finished.text]
    with pytest.raises(LocalspecError, match="no saved conversation 999"):
        conv.open(999)
    assert conv.saved_id == cid  # a failed open leaves the conversation as it was


def test_the_answered_prompt_is_the_whole_conversation(conversation):
    """The session renders exactly `messages`: no second copy can be out of step."""
    conv = conversation
    conv.set_system("Be brief.")
    conv.finish(run(conv.send("one")))
    turn = conv.send("two")
    generation = turn.begin()
    assert generation.prompt == conv.session.format.tokens(conv.messages)
    generation.cancel()
    list(generation)


def test_regenerate_drops_the_last_answer_here_and_saved(conversation):
    conv = conversation
    with pytest.raises(ContextError, match="nothing to regenerate"):
        conv.regenerate()
    first = run(conv.send("Hello"))
    conv.finish(first)
    turn = conv.regenerate()
    assert turn.kind == "regenerate" and roles(conv) == ["user"] and saved(conv) == [("user", "Hello")]
    again = run(turn)
    conv.finish(again)
    assert again.text == first.text  # greedy
    assert roles(conv) == ["user", "assistant"] and saved(conv) == [("user", "Hello"), ("assistant", first.text)]
    cid = conv.saved_id
    conv.forget(cid + 1)  # another saved chat was deleted
    assert conv.saved_id == cid
    conv.forget(cid)  # this one was: the next message saves it anew, the screen keeps it
    assert conv.saved_id is None and roles(conv) == ["user", "assistant"]


def test_a_stop_before_the_worker_starts_still_stops_and_is_saved_as_cancelled(conversation):
    conv = conversation
    assert conv.stop() is False
    turn = conv.send("Tell me a long story")
    assert conv.stop() is True
    finished = run(turn)
    conv.finish(finished)
    assert finished.reason == "cancelled"
    assert conv.store.messages(conv.saved_id)[-1].finish_reason == "cancelled"


def test_a_message_that_does_not_fit_is_taken_back_and_leaves_no_saved_chat(tiny_models, options, store):
    conv = Conversation(options, store)
    conv.begin_load()
    conv.attach(load(tiny_models, n_ctx=64))
    try:
        turn = conv.send("word " * 1000)
        assert conv.saved_id is not None and roles(conv) == ["user"]
        with pytest.raises(ContextError, match="does not fit"):
            turn.begin()
        conv.fail(turn)
        assert conv.phase is Phase.READY and conv.turn is None
        assert conv.messages == [] and conv.saved_id is None and store.conversations() == []
    finally:
        conv.detach().close()


def test_a_model_without_a_chat_template_stays_loaded_but_cannot_chat(tiny_models, options, store):
    conv = Conversation(options, store)
    conv.begin_load()
    loaded = load(tiny_models, target=tiny_models.no_template)
    with pytest.raises(LocalspecError, match="no chat template"):
        conv.attach(loaded)
    assert conv.phase is Phase.NO_MODEL and conv.session is None
    assert conv.detach() is loaded.engine  # kept so that a switch unloads it
    loaded.engine.close()


def test_the_first_system_prompt_comes_from_the_options_and_a_download_is_its_own_state(store):
    conv = Conversation(ChatOptions(system="Be brief."), store)
    assert conv.phase is Phase.NO_MODEL and conv.messages == [Message("system", "Be brief.")]
    conv.begin_pull("remote")
    assert conv.pulling == "remote" and conv.busy("chat") is None  # a download does not stop the chat
    conv.pull_ended()
    assert conv.pulling is None
    assert Conversation(ChatOptions(system="   "), store).messages == []


def test_the_controller_does_not_import_textual():
    code = (
        "import sys, localspec.tui.conversation\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'textual')\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_settings_apply_at_once_unless_the_drafter_changes(conversation, tiny_models, options, store):
    conv = conversation
    shorter = dataclasses.replace(conv.settings, max_tokens=5)
    assert conv.apply_settings(shorter) is False and conv.settings == shorter
    assert conv.apply_settings(dataclasses.replace(shorter, drafter="none")) is True
    assert conv.settings == shorter  # another drafter applies after the reload (`begin_load(settings)`)
    alone = Conversation(options, store)
    alone.begin_load()
    engine = Engine.load(tiny_models.target, drafter="none", n_ctx=512)
    alone.attach(Loaded(engine, ResolvedPair.files(tiny_models.target, None), "none"))
    try:
        with pytest.raises(InvalidParamsError, match="needs a draft model"):
            alone.apply_settings(dataclasses.replace(alone.settings, drafter="model"))
        assert alone.apply_settings(dataclasses.replace(alone.settings, drafter="ngram")) is True
    finally:
        alone.detach().close()


@pytest.mark.slow
def test_picking_a_pair_and_a_finished_download_decide_what_loads(conversation):
    conv = conversation
    assert conv.pick_pair("tiny", downloaded=True) == "loaded"
    assert conv.pick_pair("other", downloaded=True) == "load"
    assert conv.pick_pair("other", downloaded=False) == "pull"
    conv.begin_pull("other")
    assert conv.pull_ended(pulled=False) is False and conv.pulling is None  # a failed pull loads nothing
    conv.begin_pull("other")
    turn = conv.send("while it downloads")
    assert conv.pull_ended(pulled=True) is False  # an answer is running: the user switches later
    conv.finish(run(turn))
    conv.begin_pull("other")
    assert conv.pull_ended(pulled=True) is True


def test_a_regenerate_says_whether_it_replaces_an_answer(conversation):
    conv = conversation
    conv.finish(run(conv.send("Hi")))
    turn = conv.regenerate()
    assert turn.replaces_answer and roles(conv) == ["user"]
    conv.fail(turn)  # as if it could not start: the user message stays, without an answer
    again = conv.regenerate()
    assert not again.replaces_answer
    conv.finish(run(again))


# --- two windows, a growing answer (issue 44) ---------------------------------------------------------------------


@pytest.fixture
def two_windows(tiny_models, options, tmp_path):
    """Two chat windows on one data folder: two real `ChatStore`s on one SQLite file, each with its own engine."""
    path = tmp_path / "data" / "chats.sqlite3"
    windows = []
    for _ in range(2):
        conv = Conversation(options, ChatStore(path))
        conv.begin_load()
        conv.attach(load(tiny_models))
        windows.append(conv)
    yield windows
    for conv in windows:
        engine = conv.detach()
        if engine is not None:
            engine.close()
        conv.close()


@pytest.mark.slow
def test_a_chat_deleted_in_another_window_is_saved_again_never_into_the_next_chat(two_windows):
    alice, bob = two_windows
    alice.finish(run(alice.send("Alice: hello")))
    assert alice.take_notices() == []
    bob.store.delete(alice.saved_id)  # window B deletes the chat window A is in (the newest: its id was free)
    bob.finish(run(bob.send("Bob: hi")))
    turn = alice.send("Alice: are you there?")  # before: saved into Bob's chat, which had taken the freed id
    alice.finish(run(turn))
    assert alice.take_notices() == [RESAVED] and alice.take_notices() == []
    assert [m for m, _ in saved(bob)] == ["user", "assistant"] and saved(bob)[0] == ("user", "Bob: hi")
    assert alice.saved_id != bob.saved_id
    assert [m.content for m in alice.dialogue] == [c for _, c in saved(alice)]  # the whole chat on screen, once
    assert [r for r, _ in saved(alice)] == ["user", "assistant", "user", "assistant"]
    assert alice.store.get(alice.saved_id).title == "Alice: hello"
    assert sorted(c.title for c in alice.store.conversations()) == ["Alice: hello", "Bob: hi"]


def test_an_answer_whose_chat_was_deleted_meanwhile_is_saved_with_the_chat(two_windows):
    alice, bob = two_windows
    turn = alice.send("Alice: hello")
    finished = run(turn)
    bob.store.delete(alice.saved_id)  # while the answer was being written
    alice.finish(finished)  # before: refused by the database and lost
    assert alice.take_notices() == [RESAVED]
    assert saved(alice) == [("user", "Alice: hello"), ("assistant", finished.text)]
    [_, answer] = alice.store.messages(alice.saved_id)
    assert answer.finish_reason == "length" and answer.stats["emitted"] == 16


def test_the_answer_is_saved_as_it_grows_then_rewritten_whole(conversation):
    conv = conversation
    turn = conv.send("Hello there")
    chunks: list[Chunk] = []
    done: list[Finished] = []
    stream_generation(turn.begin(), lambda i: (chunks if isinstance(i, Chunk) else done).append(i), interval=0)
    assert len(chunks) > 2
    conv.grow(chunks[0], now=100.0)  # the first chunk is saved at once
    [_, first] = conv.store.messages(conv.saved_id)
    assert (first.role, first.finish_reason, first.content) == ("assistant", "interrupted", chunks[0].runs[0][0])
    conv.grow(chunks[1], now=100.0 + SAVE_EVERY / 2)  # too soon: kept for the next save
    assert conv.store.messages(conv.saved_id)[1].content == first.content
    for chunk in chunks[2:-1]:
        conv.grow(chunk, now=100.0 + SAVE_EVERY)  # saved at the first of these, the others kept
    conv.grow(chunks[-1], now=100.0 + 2 * SAVE_EVERY)
    [_, grown] = conv.store.messages(conv.saved_id)
    text = "".join(t for c in chunks for t, _ in c.runs)
    assert grown.id == first.id and grown.content == text and grown.finish_reason == "interrupted"
    assert "".join(t for t, _ in grown.provenance) == text
    conv.finish(done[0])
    [_, answer] = conv.store.messages(conv.saved_id)
    assert answer.id == first.id and answer.content == done[0].text == text and answer.finish_reason == "length"


@pytest.mark.slow
def test_a_failed_save_keeps_the_message_out_and_the_next_one_works(conversation):
    conv = conversation
    conv.finish(run(conv.send("Hello")))
    other = sqlite3.connect(conv.store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    conv.store.db.execute("PRAGMA busy_timeout = 50")
    try:
        with pytest.raises(LocalspecError, match="locked"):
            conv.send("Second")
        assert roles(conv) == ["user", "assistant"] and conv.phase is Phase.READY
    finally:
        other.execute("ROLLBACK")
        other.close()
    conv.finish(run(conv.send("Second")))
    assert [c for _, c in saved(conv)][2] == "Second"


# --- edit and branch (issue 48) -------------------------------------------------------------------------------------


def test_an_edit_is_a_new_branch_that_rereads_only_what_differs(conversation):
    from localspec.core.kv import common_prefix

    conv = conversation
    conv.finish(run(conv.send("one")))
    conv.finish(run(conv.send("two")))
    shared = conv.messages[:2]  # the first question and its answer
    old_branch, old_render = list(conv.ids), conv.session.format.tokens(conv.messages)
    cached = list(conv.loaded.engine.target.tokens)  # what the target's cache holds after the second answer
    turn = conv.edit(conv.ids[2], "two, edited ")
    assert turn.kind == "edit" and turn.at == 2 and conv.messages[:2] == shared
    assert all(a is b for a, b in zip(conv.messages[:2], shared, strict=True))  # the same objects, not copies
    assert saved(conv)[2] == ("user", "two, edited")  # saved before it is answered, on the branch on screen
    generation = turn.begin()
    prompt = generation.prompt
    done = []
    stream_generation(generation, lambda item: done.append(item) if isinstance(item, Finished) else None)
    conv.finish(done[0])
    # The cache keeps all that it shares with the old branch's rendering up to where the branches differ (an
    # answer's tokens may be cut otherwise when its text is rendered again: a next turn would re-read those too).
    common = common_prefix(cached, prompt[:-1])
    assert common >= min(common_prefix(cached, old_render), common_prefix(old_render, prompt))
    assert common > len(conv.session.format.tokens(shared[:1]))
    assert done[0].stats.prefill_decoded == len(prompt) - 1 - common < len(prompt) // 2  # only the new tail read
    assert roles(conv) == ["user", "assistant"] * 2 and conv.messages[2].content == "two, edited"
    assert [m.branch for m in conv.saved_messages()] == [(1, 1), (1, 1), (2, 2), (1, 1)]
    assert len(conv.store.tree(conv.saved_id)) == 6  # the old question and its answer are kept
    start, stored = conv.switch(conv.ids[2], -1)
    assert start == 2 and conv.ids == old_branch and [m.id for m in stored] == old_branch
    assert conv.messages[2].content == "two" and all(a is b for a, b in zip(conv.messages[:2], shared, strict=True))
    assert conv.switch(conv.ids[2], -1) is None  # no branch before the first
    conv.finish(run(conv.send("three")))  # the old branch goes on
    assert [c for _, c in saved(conv)][:3] == ["one", shared[1].content, "two"] and len(saved(conv)) == 6


@pytest.mark.slow
def test_an_empty_edit_and_an_answer_edited_are_refused_and_change_nothing(conversation):
    conv = conversation
    conv.finish(run(conv.send("Hello")))
    before = (list(conv.messages), list(conv.ids), saved(conv))
    with pytest.raises(InvalidParamsError, match="cannot be empty"):
        conv.edit(conv.ids[0], " \n ")
    with pytest.raises(ContextError, match="only your own messages"):
        conv.edit(conv.ids[1], "new words")
    with pytest.raises(ContextError, match="no longer in this chat"):
        conv.edit(12345, "new words")
    assert (conv.messages, conv.ids, saved(conv)) == before and conv.phase is Phase.READY


def test_an_edit_that_cannot_start_brings_the_old_branch_back(tiny_models, options, store):
    conv = Conversation(options, store)
    conv.begin_load()
    conv.attach(load(tiny_models, n_ctx=256))
    try:
        conv.finish(run(conv.send("Hi")))
        before = (list(conv.messages), list(conv.ids), saved(conv))
        turn = conv.edit(conv.ids[0], "word " * 400)  # does not fit
        with pytest.raises(ContextError):
            turn.begin()
        conv.fail(turn)
        assert (conv.messages, conv.ids, saved(conv)) == before
        assert len(conv.store.tree(conv.saved_id)) == 2  # the edit that was not answered is not kept
    finally:
        conv.detach().close()


@pytest.mark.slow
def test_an_answer_generated_again_is_a_sibling_and_the_old_one_comes_back(conversation):
    conv = conversation
    first = run(conv.send("Hello"))
    conv.finish(first)
    old_answer = conv.ids[1]
    conv.finish(run(conv.send("More")))
    turn = conv.regenerate(old_answer)  # a past answer: it and what followed leave the screen
    assert turn.at == 1 and roles(conv) == ["user"] and saved(conv) == [("user", "Hello")]
    conv.finish(run(turn))
    assert [m.branch for m in conv.saved_messages()] == [(1, 1), (2, 2)]
    with pytest.raises(ContextError, match="that is your message"):
        conv.regenerate(conv.ids[0])
    start, _ = conv.switch(conv.ids[1], -1)
    assert start == 1 and conv.ids[1] == old_answer and [c for _, c in saved(conv)][2] == "More"
    hidden = conv.store.tree(conv.saved_id)[-1].id  # the newest answer, on the branch not shown
    conv.open(conv.saved_id, at=hidden)  # a search hit there opens its branch
    assert conv.ids[-1] == hidden


def test_two_windows_on_one_chat_each_continue_their_own_branch(two_windows):
    alice, bob = two_windows
    alice.finish(run(alice.send("Alice: hello")))
    bob.open(alice.saved_id)
    alice.finish(run(alice.send("Alice: and then?")))
    bob.finish(run(bob.send("Bob: and now?")))
    assert [m.content for m in alice.dialogue][2] == "Alice: and then?"  # neither sees the other's turn
    assert [m.content for m in bob.dialogue][2] == "Bob: and now?"
    shown = alice.store.messages(alice.saved_id)  # the last written branch, the other beside it
    assert shown[2].content == "Bob: and now?" and shown[2].branch == (2, 2) and len(shown) == 4
