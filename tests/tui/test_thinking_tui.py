"""Reasoning models in the chat app, with Textual's Pilot on the real engine and the tiny thinking models (Qwen3's
real template): the thinking block above the answer, folded when the answer starts, F8 and its remembered
preference, Ctrl+T inside the block, the split stats, the F3 switch per chat (saved, resumed), a model that
cannot switch, and the answer's thinking saved apart."""

from __future__ import annotations

import dataclasses

import pytest
from rich.text import Text
from support.tinymodels import ANSWER_TEXT, REASONING_TEXT
from support.tui import open_settings, record_notifications, send, wait_ready, wait_until
from textual.app import App
from textual.widgets import Select, Static

from localspec.tui.app import make_app
from localspec.tui.blocks import BlockText
from localspec.tui.chat_screen import THINKING_PREFERENCE
from localspec.tui.screens import SettingsScreen
from localspec.tui.store import ChatStore
from localspec.tui.widgets import DRAFT_STYLE, ChatMessage, StatsPanel, ThinkingBlock

pytestmark = pytest.mark.anyio

SIZE = (110, 36)


@pytest.fixture
def thinking_options(thinking_home, options):
    return dataclasses.replace(options, pair="thinking", max_tokens=40, overrides={"adaptive": False, "draft_max": 4})


def answers(app) -> list[ChatMessage]:
    return list(app.query(ChatMessage).filter(".assistant"))


def stats_text(app) -> str:
    return str(app.query_one(StatsPanel).render())


def body(block: ThinkingBlock) -> str:
    return block.text


async def test_thinking_is_a_folded_block_above_the_answer_and_saved_apart(thinking_options, thinking_home):
    app = make_app(thinking_options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Hi")
        [answer] = answers(app)
        block = answer.thinking
        assert block is not None and block.collapsed and not block.has_class("-empty")
        assert body(block) == REASONING_TEXT and answer.text == ANSWER_TEXT
        assert block.title == "thought · 11 tokens (F8)"
        children = list(answer.children)
        assert children.index(block) < children.index(answer.query_one(".md-body"))  # above the answer
        panel = stats_text(app)
        assert "thinking   answer" in panel
        assert "tokens              11        5" in panel
        assert "acceptance        100%      55%" in panel  # the draft proposes another word after "Hello"
        [user, saved] = ChatStore(thinking_home.db_path).messages(app.chat.saved_id)
        assert (saved.content, saved.reasoning) == (ANSWER_TEXT, REASONING_TEXT)
        assert "".join(t for t, _ in saved.reasoning_provenance) == REASONING_TEXT
        assert saved.stats["parts"]["thinking"]["tokens"] == 11
        assert app.chat.messages[-1].reasoning == REASONING_TEXT


@pytest.mark.slow
async def test_f8_unfolds_every_block_and_is_remembered(thinking_options, thinking_home):
    app = make_app(thinking_options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Hi")
        await pilot.press("f8")
        assert not answers(app)[0].thinking.collapsed and app.screen.thinking_expanded
        await send(pilot, "Again")
        assert [a.thinking.collapsed for a in answers(app)] == [False, False]  # stays unfolded after the answer
    assert ChatStore(thinking_home.db_path).preference(THINKING_PREFERENCE) is True
    again = make_app(thinking_options)
    async with again.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert again.screen.thinking_expanded
        await send(pilot, "Hi")
        assert not answers(again)[0].thinking.collapsed
        await pilot.press("f8")
        assert answers(again)[0].thinking.collapsed
    assert ChatStore(thinking_home.db_path).preference(THINKING_PREFERENCE) is False


async def test_draft_colours_work_inside_the_thinking(thinking_options):
    app = make_app(thinking_options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Hi")
        block = answers(app)[0].thinking
        await pilot.press("f8", "ctrl+t")
        prov = block.query_one(".think-prov", BlockText)
        assert prov.display and not block.query_one(".think-body", BlockText).display
        rendered = prov.blocks.styled()
        assert isinstance(rendered, Text) and rendered.plain.strip() == REASONING_TEXT
        assert DRAFT_STYLE in {str(span.style) for span in rendered.spans}  # the draft's thinking tokens


class HostApp(App):
    """One answer widget on its own, fed chunks as the app's handler would."""

    def compose(self):
        yield ChatMessage("assistant")


async def test_the_block_streams_unfolded_and_folds_when_the_answer_starts():
    app = HostApp()
    async with app.run_test() as pilot:
        message = app.query_one(ChatMessage)
        block = message.thinking
        assert block.has_class("-empty")  # hidden (by the app's stylesheet) until thinking comes
        await message.append([], [("We must", True)], 2)
        await pilot.pause()
        assert not block.collapsed and block.live and block.title.startswith("thinking…")
        await message.append([], [(" give them", False)], 4)
        assert body(block) == "We must give them" and not block.collapsed
        await message.append([("Hello", False)], [], 4)
        assert block.collapsed and not block.live and block.title == "thought · 4 tokens (F8)"
        await message.finish("Hello", [("Hello", False)], "", [("We must", True), (" give them", False)], 4)
        assert block.collapsed and body(block) == "We must give them"


async def test_thinking_cut_short_stays_open():
    app = HostApp()
    async with app.run_test():
        message = app.query_one(ChatMessage)
        await message.append([], [("still thinking", False)], 3)
        await message.finish("", [], "cut at max tokens", [("still thinking", False)], 3)
        assert not message.thinking.collapsed  # no answer came: the thinking is all there is to read


@pytest.mark.slow
async def test_f3_switches_thinking_for_this_chat_and_it_is_kept(thinking_options, thinking_home):
    app = make_app(thinking_options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Hi")
        await open_settings(pilot)
        switch = app.screen.query_one("#think", Select)
        assert switch.value == "default"
        switch.value = "off"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen), what="the settings to close")
        await send(pilot, "Again")
        second = answers(app)[1]
        assert second.text == ANSWER_TEXT and second.thinking.has_class("-empty")  # the model did not think
        assert app.chat.messages[-1].reasoning == ""
        cid = app.chat.saved_id
        assert ChatStore(thinking_home.db_path).get(cid).think is False
        await pilot.press("ctrl+n")
        assert app.chat.settings.think is None  # a new chat starts at the default
        await app.screen.resume(cid)
        assert app.chat.settings.think is False  # the chat's own switch comes back with it
        blocks = [a.thinking for a in answers(app)]
        assert [b.has_class("-empty") for b in blocks] == [False, True] and body(blocks[0]) == REASONING_TEXT


@pytest.mark.slow
async def test_a_model_that_cannot_switch_says_so(thinking_options, thinking_home):
    app = make_app(dataclasses.replace(thinking_options, pair="always-off"))
    seen = record_notifications(app)  # before it runs: the pair may be loaded by the time the test gets control
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await wait_until(pilot, lambda: any("cannot be followed" in s for s in seen), what="the notice")
        assert any("`thinking = false` of pair 'always-off' in models.toml" in s for s in seen)
        await open_settings(pilot)
        assert not app.screen.query("#think")
        note = str(app.screen.query_one("#think-note", Static).render())
        assert note == "always on (no switch in its template)"
        await pilot.press("escape")
        await send(pilot, "Hi")  # it thinks anyway, and the chat goes on
        assert answers(app)[0].text == ANSWER_TEXT and body(answers(app)[0].thinking) == REASONING_TEXT


async def test_regenerate_keeps_the_split(thinking_options):
    app = make_app(thinking_options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Hi")
        before = app.chat.turn_ids
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: app.chat.turn_ids > before and app.chat.turn is None, what="the answer")
        await pilot.pause()
        [answer] = answers(app)
        assert answer.text == ANSWER_TEXT and body(answer.thinking) == REASONING_TEXT


async def test_think_off_from_the_command_line(thinking_options):
    app = make_app(dataclasses.replace(thinking_options, think=False))  # `localspec chat --think off`
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert app.chat.default_think is False and app.chat.think is False
        await send(pilot, "Hi")
        [answer] = answers(app)
        assert answer.text == ANSWER_TEXT and answer.thinking.has_class("-empty")
