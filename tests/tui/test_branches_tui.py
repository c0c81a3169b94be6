"""Search every chat, edit and branch, prompt history (issue 48), driven by Pilot on the real tiny pair and a real
SQLite store; each bad input — FTS5 syntax in a search, an empty edit, a branch switch while an answer streams — is
one line and loses nothing."""

from __future__ import annotations

import dataclasses

import pytest
from support.tui import hold_answers, record_notifications, send, wait_ready, wait_until
from textual import events
from textual.widgets import Input, OptionList, Static

from localspec.tui.app import make_app
from localspec.tui.screens import SearchScreen, TextPromptScreen
from localspec.tui.store import ChatStore
from localspec.tui.widgets import ChatMessage, PromptInput

pytestmark = pytest.mark.anyio

SIZE = (110, 36)
LONG = 1800  # tokens: an answer that streams long enough to press keys meanwhile


def shown(app, role: str) -> list[ChatMessage]:
    return list(app.query(ChatMessage).filter(f".{role}"))


def caption(widget: ChatMessage) -> str:
    return str(widget.query_one(".caption", Static).render())


@pytest.mark.slow
async def test_ctrl_f_finds_a_word_of_an_earlier_chat_and_opens_it_there(options, chat_home):
    store = ChatStore(chat_home.db_path)
    earlier = store.create_conversation("Animals")
    store.add_message(earlier, "user", "Tell me about zebras")
    target = store.add_message(earlier, "assistant", "Zebras have black and white stripes.")
    for i in range(30):  # a long chat: the hit must be scrolled to
        store.add_message(earlier, "user", f"filler question {i}")
        store.add_message(earlier, "assistant", f"filler answer {i}\n\nwith a second paragraph")
    store.close()
    app = make_app(options)
    notes = record_notifications(app)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Hello")  # the chat on screen is another one
        await pilot.press("ctrl+f")
        await wait_until(pilot, lambda: isinstance(app.screen, SearchScreen), what="the search screen")
        box = app.screen.query_one(Input)
        for query in ['"', 'stripes" AND (', "-", "NEAR(", "*", "a:b"]:  # FTS5's syntax is only text
            box.value = query
            await pilot.pause()
        assert isinstance(app.screen, SearchScreen) and not [n for n in notes if "rror" in n]
        box.value = "stripe"  # a word's start finds it
        await wait_until(pilot, lambda: app.screen.query_one(OptionList).option_count == 1, what="one hit")
        hit = str(app.screen.query_one(OptionList).get_option_at_index(0).prompt)
        assert "Animals" in hit and "Zebras have black and white stripes." in hit
        assert "1 message" in str(app.screen.query_one("#found", Static).render())
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.chat.saved_id == earlier, what="the chat to open")
        await pilot.pause()
        focused = app.screen.focused
        assert isinstance(focused, ChatMessage) and focused.message_id == target
        messages = app.query_one("#messages")
        assert messages.scroll_y < messages.max_scroll_y  # scrolled up to it, not left at the end
        assert focused.region.y >= messages.region.y and focused.region.bottom <= messages.region.bottom
        await pilot.press("ctrl+f")
        await wait_until(pilot, lambda: isinstance(app.screen, SearchScreen), what="the search screen")
        app.screen.query_one(Input).value = "nothing matches this"
        await pilot.pause()
        assert "no message has these words" in str(app.screen.query_one("#found", Static).render())
        await pilot.press("escape")
        assert app.chat.saved_id == earlier


@pytest.mark.slow
async def test_an_edited_message_shows_2_of_2_and_left_returns_to_the_first_branch(options, chat_home):
    app = make_app(options)
    notes = record_notifications(app)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Hello")
        first_answer = shown(app, "assistant")[0].text
        shown(app, "user")[0].focus()
        await pilot.press("e")
        await wait_until(pilot, lambda: isinstance(app.screen, TextPromptScreen), what="the edit")
        app.screen.query_one("#value").text = "   "
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, TextPromptScreen), what="the edit to close")
        assert any("cannot be empty" in n for n in notes)  # refused with one line, nothing changed
        assert [m.content for m in app.chat.messages] == ["Hello", first_answer]
        before = app.chat.turn_ids
        shown(app, "user")[0].focus()
        await pilot.press("e")
        await wait_until(pilot, lambda: isinstance(app.screen, TextPromptScreen), what="the edit")
        app.screen.query_one("#value").text = "Hello, edited"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: app.chat.turn_ids > before and app.chat.turn is None, what="the answer")
        [user] = shown(app, "user")
        assert user.text == "Hello, edited" and "2/2" in caption(user) and len(shown(app, "assistant")) == 1
        assert isinstance(app.screen.focused, PromptInput)  # the edited message's widget went: keys go on somewhere
        user.focus()
        await pilot.press("left")
        await wait_until(pilot, lambda: shown(app, "user")[0].text == "Hello", what="the first branch")
        [user] = shown(app, "user")
        assert "1/2" in caption(user) and [a.text for a in shown(app, "assistant")] == [first_answer]
        assert [m.content for m in app.chat.messages] == ["Hello", first_answer]
        assert [m.content for m in app.chat.store.messages(app.chat.saved_id)] == ["Hello", first_answer]
        await pilot.press("left")
        assert any("no other branch before this one" in n for n in notes)
        await pilot.press("right")
        await wait_until(pilot, lambda: shown(app, "user")[0].text == "Hello, edited", what="the second branch")


@pytest.mark.slow
async def test_a_branch_switch_while_an_answer_streams_is_refused_and_loses_nothing(options, chat_home, monkeypatch):
    held = hold_answers(monkeypatch)  # the long answer streams until the keys were pressed
    app = make_app(options)
    notes = record_notifications(app)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Hi")
        before = app.chat.turn_ids
        await pilot.press("ctrl+r")  # an answer generated again is a sibling of the first
        await wait_until(pilot, lambda: app.chat.turn_ids > before and app.chat.turn is None, what="the answer")
        assert "2/2" in caption(shown(app, "assistant")[0])
        app.chat.settings = dataclasses.replace(app.chat.settings, max_tokens=LONG)
        held.clear()
        app.query_one(PromptInput).text = "Tell me a long story"
        await pilot.press("enter")
        await wait_until(
            pilot, lambda: len(shown(app, "assistant")) == 2 and shown(app, "assistant")[1].text, what="text"
        )
        messages = list(app.chat.messages)
        # Keys as the terminal sends them (Pilot.press would wait for the answer's end), each on a selected message.
        for key, widget, refusal in (
            ("left", shown(app, "assistant")[0], "before you switch branches"),
            ("r", shown(app, "assistant")[0], "before you regenerate"),
            ("e", shown(app, "user")[0], "before you edit a message"),
        ):
            widget.focus()
            await wait_until(pilot, lambda w=widget: app.screen.focused is w, what="the selection")
            app.post_message(events.Key(key, None if key == "left" else key))
            await wait_until(pilot, lambda r=refusal: any(r in n for n in notes), what=refusal)
            assert sum(refusal in n and "press Esc to stop it" in n for n in notes) == 1
        assert app.chat.messages[: len(messages)] == messages and "2/2" in caption(shown(app, "assistant")[0])
        held.set()
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.chat.turn is None, what="the stop")
        shown(app, "assistant")[0].focus()
        await pilot.press("left")  # once stopped, the switch works
        await wait_until(pilot, lambda: "1/2" in caption(shown(app, "assistant")[0]), what="the switch")
        assert [m.role for m in app.chat.messages] == ["user", "assistant"]


@pytest.mark.slow
async def test_up_in_an_empty_prompt_recalls_the_last_prompt_after_a_restart(options, chat_home):
    app = make_app(options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "first prompt")
        await send(pilot, "second prompt")
    app = make_app(options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        prompt = app.query_one(PromptInput)
        await pilot.press("up")
        assert prompt.text == "second prompt"
        await pilot.press("up")
        assert prompt.text == "first prompt"
        await pilot.press("up")  # nothing older: it stays
        assert prompt.text == "first prompt"
        await pilot.press("down", "down")
        assert prompt.text == ""
        await pilot.press("up", "x", "up")  # once the text is changed, ↑ moves the cursor again
        assert prompt.text == "second promptx"
        prompt.text = "typed by hand"
        await pilot.press("up")
        assert prompt.text == "typed by hand"
        prompt.text = ""
        await pilot.press("up", "enter")  # a recalled prompt is sent as typed
        await wait_until(pilot, lambda: app.chat.turn is None and app.chat.messages, what="the answer")
        assert app.chat.messages[0].content == "second prompt"
