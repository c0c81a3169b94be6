"""The chat app in any window size (issue #21): narrow and tiny windows, resizes while an answer streams.

Before, a window 40 columns wide or less squeezed the chat beside the 40-column stats panel to no width, and
the prompt box's placeholder, wrapped to 0 columns, raised `ValueError: range() arg 3 must not be zero` inside
Textual: the app exited and the answer being written was lost. The app drives itself here through Pilot on the
real tiny pair, as in test_tui.py; a crash while drawing propagates out of `run_test` and fails the test.
"""

from __future__ import annotations

import dataclasses

import pytest
from support.tui import hold_answers, record_notifications, send, wait_ready, wait_until
from textual import events
from textual.app import App
from textual.geometry import Size
from textual.widgets import Static

from localspec.tui.app import make_app
from localspec.tui.store import ChatStore
from localspec.tui.styles import MIN_HEIGHT, MIN_WIDTH, STATS_WIDTH
from localspec.tui.widgets import ChatMessage, PromptInput, StatsPanel

pytestmark = pytest.mark.anyio

SIZE = (110, 36)
LONG = 1800  # tokens: an answer that is still streaming while the window is resized a few times
NAMED = [(40, 12), (30, 10), (20, 8), (20, 30), (45, 12), (10, 5)]  # the sizes the issue names, and a tiny one


def shown(app, selector: str) -> bool:
    """Whether the widget is on the screen (a hidden widget, or one in a hidden container, has no region)."""
    return app.query_one(selector).region.area > 0


async def resize(pilot, width: int, height: int) -> None:
    """`pilot.resize_terminal` with a short pause: its own waits for an idle CPU, which a streaming answer is not."""
    pilot.app._driver._size = Size(width, height)  # the headless driver's size, as resize_terminal sets it
    pilot.app.post_message(events.Resize(Size(width, height), Size(width, height)))
    await pilot.pause(0.05)  # the app passes a resize on after 1/120 s; the screen is laid out and drawn in this


def saved_rows(chat_home, conversation_id):
    store = ChatStore(chat_home.db_path)
    try:
        return store.messages(conversation_id)
    finally:
        store.close()


class _PromptHost(App[None]):
    def compose(self):
        yield PromptInput(placeholder="Message (Enter sends · Ctrl+J new line · Esc stops)")


@pytest.mark.parametrize("width", [1, 2, 3, 4])
async def test_the_prompt_box_draws_with_no_room_for_its_placeholder(width):
    """Textual's TextArea wraps its placeholder to the content width; at 0 columns that raised ValueError."""
    app = _PromptHost()
    async with app.run_test(size=(width, 5)) as pilot:
        await pilot.pause()
        box = app.query_one(PromptInput)
        assert box.content_size.width == 0  # its border and padding take all the columns
        await pilot.resize_terminal(width + 1, 5)
        await pilot.resize_terminal(width, 5)
        await pilot.pause()
    assert app.return_code is None


@pytest.mark.slow
async def test_the_layout_follows_the_window_size(options, chat_home):
    app = make_app(options)
    notes = record_notifications(app)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        too_small = app.query_one("#too-small", Static)
        assert shown(app, "#stats") and shown(app, "PromptInput") and not shown(app, "#too-small")
        await pilot.resize_terminal(STATS_WIDTH - 1, 12)
        await pilot.pause()
        assert not shown(app, "#stats") and shown(app, "PromptInput") and not shown(app, "#too-small")
        await pilot.press("f7")
        assert any(f"{STATS_WIDTH} columns" in note for note in notes)
        await pilot.press("f7")
        await pilot.resize_terminal(MIN_WIDTH, MIN_HEIGHT)
        await pilot.pause()
        box = app.query_one(PromptInput)
        assert shown(app, "PromptInput") and box.content_size.width > 0 and box.region.height == 3
        assert app.query_one("#messages").region.height >= 1
        for size in [(MIN_WIDTH - 1, 30), (60, MIN_HEIGHT - 1), (10, 5)]:
            await pilot.resize_terminal(*size)
            await pilot.pause()
            assert not shown(app, "PromptInput") and shown(app, "#too-small")
            assert f"{MIN_WIDTH}×{MIN_HEIGHT}" in str(too_small.render())
        await pilot.resize_terminal(*SIZE)
        await pilot.pause()
        assert shown(app, "#stats") and shown(app, "PromptInput") and not shown(app, "#too-small")
        await send(pilot, "still here?")  # the chat works after all that
        assert [m.role for m in app.chat.messages] == ["user", "assistant"]


@pytest.mark.slow
async def test_resizing_mid_answer_keeps_the_answer(options, chat_home, monkeypatch):
    held = hold_answers(monkeypatch)
    app = make_app(dataclasses.replace(options, max_tokens=LONG))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        app.query_one(PromptInput).text = "Tell me a long story"
        held.clear()  # the answer streams on until the resizes are done
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.query(ChatMessage).filter(".assistant").last().text, what="text")
        for size in NAMED:
            await resize(pilot, *size)
        await resize(pilot, *SIZE)
        assert app.chat.turn is not None, "the answer ended before the resizes: nothing was tested mid-answer"
        held.set()
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.chat.turn is None, what="the stop")
        answer = app.query(ChatMessage).filter(".assistant").last()
        rows = saved_rows(chat_home, app.chat.saved_id)
        assert [(m.role, m.finish_reason) for m in rows] == [("user", None), ("assistant", "cancelled")]
        assert rows[1].content == answer.text and answer.text
        assert str(app.query_one(StatsPanel).render())  # the panel came back with the wide window


@pytest.mark.slow
async def test_every_window_size_from_10x5_to_120x40(options, chat_home):
    """The size sweep: widths 10–120 step 10 by heights 5–40 step 5, with an answer on screen and the placeholder."""
    app = make_app(options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "First")  # a finished answer in the list, Markdown and all
        for width in range(10, 121, 10):
            heights = range(5, 41, 5) if width % 20 else range(40, 4, -5)  # snake: both directions of each step
            for height in heights:
                await resize(pilot, width, height)
                small = width < MIN_WIDTH or height < MIN_HEIGHT
                assert shown(app, "#too-small" if small else "PromptInput"), f"{width}×{height}"
        await resize(pilot, *SIZE)
        await send(pilot, "Second")
        rows = saved_rows(chat_home, app.chat.saved_id)
        assert [m.role for m in rows] == ["user", "assistant", "user", "assistant"]
