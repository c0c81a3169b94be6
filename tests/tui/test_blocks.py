"""The chat's message text as cached blocks (tui/blocks.py) and the screen's frame budget (tui/live.py).

What issue 42 asked of the screen: an update costs what changed, not the whole answer (a streamed answer renders
each finished block once and re-renders only its tail), the screen is laid out again only when a message's height
steps, and the text streamed in pieces looks exactly as the same text drawn at once.
"""

from __future__ import annotations

import random

import pytest
from rich.text import Text
from textual.app import App
from textual.widget import Widget

from localspec.tui.blocks import BlockText, LineBlocks, MarkdownBlocks
from localspec.tui.live import FrameBudget

pytestmark = pytest.mark.anyio  # the async tests; the others run as they are

ANSWER = (
    "# The sea\n\nThe sea rolls under a **grey** sky,\nand gulls cry over the harbour.\n\n"
    "- waves\n- stones\n- salt\n\n"
    "```python\ndef tide(x):\n\n    return x * 2\n```\n\n"
    "> a quoted line\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nThe end, at last."
)


def pieces(text: str, seed: int = 0) -> list[str]:
    """The text cut at random places, as a model's tokens arrive."""
    rng, out, i = random.Random(seed), [], 0
    while i < len(text):
        n = rng.randint(1, 9)
        out.append(text[i : i + n])
        i += n
    return out


def test_markdown_blocks_finish_a_block_only_when_the_next_one_starts():
    blocks = MarkdownBlocks()
    blocks.feed("First paragraph,\nstill the first")
    assert blocks.finished == [] and blocks.tail() is not None
    blocks.feed("\n\n")
    assert blocks.finished == []  # a blank line alone does not end it: a list could still continue it
    blocks.feed("Second")
    assert len(blocks.finished) == 1 and blocks.finished[0].markup == "First paragraph,\nstill the first"
    blocks.feed("\n\n```\ncode\n\nmore code")  # a blank line inside a fence is part of the fence
    assert len(blocks.finished) == 2 and blocks.tail().markup == "```\ncode\n\nmore code"
    blocks.close()
    assert len(blocks.finished) == 3 and blocks.tail() is None
    assert blocks.text() == "First paragraph,\nstill the first\n\nSecond\n\n```\ncode\n\nmore code"


def test_line_blocks_keep_the_styles_of_each_piece():
    lines = LineBlocks()
    for text, style in [("draft ", "green"), ("target\nnext ", ""), ("line", "green")]:
        lines.feed(text, style)
    assert [t.plain for t in lines.finished] == ["draft target"] and lines.tail().plain == "next line"
    styled = lines.styled()
    assert styled.plain == "draft target\nnext line"
    assert [(styled.plain[s.start : s.end], str(s.style)) for s in styled.spans if s.style] == [
        ("draft ", "green"),
        ("line", "green"),
    ]
    lines.close()
    assert lines.text() == "draft target\nnext line" and lines.tail() is None


class Host(App):
    """One BlockText on its own, 60 columns wide."""

    CSS = "Screen { overflow: hidden; } BlockText { width: 60; }"  # no scrollbar to change the width

    def __init__(self, blocks) -> None:
        super().__init__()
        self.view = BlockText(blocks)

    def compose(self):
        yield self.view


class Counting(BlockText):
    """Counts what it renders and how often it asks for a new layout."""

    def __init__(self, blocks) -> None:
        super().__init__(blocks)
        self.renders: list = []  # the renderables themselves: a tail's id may be reused once it is gone
        self.layouts = 0

    def _render(self, renderable, width):
        self.renders.append(renderable)
        return super()._render(renderable, width)

    def changed(self) -> None:
        self._asking = True  # a layout it asks for (Textual asks for one more after each size change)
        try:
            super().changed()
        finally:
            self._asking = False

    def refresh(self, *regions, repaint=True, layout=False, recompose=False) -> Widget:
        self.layouts += layout and getattr(self, "_asking", False)
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)


def lines_of(view: BlockText) -> list[str]:
    view._update(view._width)
    return [line.text.rstrip() for line in view._lines + list(view._tail or ())]


@pytest.mark.slow
async def test_text_streamed_in_pieces_looks_as_the_same_text_drawn_at_once():
    streamed, whole = Host(MarkdownBlocks()), Host(MarkdownBlocks(ANSWER))
    async with streamed.run_test(size=(60, 50)) as pilot:
        for piece in pieces(ANSWER):
            streamed.view.blocks.feed(piece)
            streamed.view.changed()
            await pilot.pause()
        streamed.view.blocks.close()
        streamed.view.changed()
        await pilot.pause()
        got = lines_of(streamed.view)
    async with whole.run_test(size=(60, 50)) as pilot:
        whole.view.blocks.close()
        whole.view.changed()
        await pilot.pause()
        expected = lines_of(whole.view)
    assert got == expected
    shown = "\n".join(got)
    assert "The sea rolls under a grey sky, and gulls cry" in shown and " 1  2" in shown
    assert "harbour.\n\n • waves" in shown  # one blank line between blocks (Rich opens a list with another)


@pytest.mark.slow
async def test_a_long_answer_renders_each_finished_block_once_and_lays_out_only_when_its_height_steps():
    paragraphs = [" ".join(f"word{i}x{j}" for j in range(30)) for i in range(40)]  # 40 blocks, ~3,000 tokens' text
    text = "\n\n".join(paragraphs)
    app = Host(MarkdownBlocks())
    app.view = view = Counting(MarkdownBlocks())
    view.step = 4
    async with app.run_test(size=(60, 50)) as pilot:
        chunks = [text[i : i + 40] for i in range(0, len(text), 40)]  # a frame every ten tokens or so
        for piece in chunks:
            view.blocks.feed(piece)
            view.changed()
            await pilot.pause()
        finished = {id(block) for block in view.blocks.finished}
        assert len(finished) == len(paragraphs) - 1
        assert sum(1 for r in view.renders if id(r) in finished) == len(finished)  # each finished block: once
        assert len(view.renders) <= len(chunks) + len(finished) + 2  # plus one tail render per update, no more
        height = len(view._lines) + len(view._tail)
        assert view.layouts <= height // 4 + 2  # a new layout only when the height passes a step of 4 lines
        assert view.size.height % 4 == 0 and view.size.height >= height


def fake_clocks(cpu_per_frame: float):
    """A UI thread whose frames each cost `cpu_per_frame` seconds of CPU, and a wall clock the test moves."""
    state = {"wall": 0.0, "cpu": 0.0}
    return state, (lambda: state["cpu"]), (lambda: state["wall"])


def test_the_frame_budget_keeps_the_ui_thread_to_its_share_of_a_core():
    for cost in (0.001, 0.008, 0.030):
        state, cpu, clock = fake_clocks(cost)
        budget = FrameBudget(share=0.03, fastest=1 / 30, slowest=1.0, burst=0.02, cpu=cpu, clock=clock)
        for _ in range(300):
            state["cpu"] += cost  # drawing the frame
            state["wall"] += cost
            state["wall"] += budget.pause()  # the worker sends the next chunk after the pause
        share = state["cpu"] / state["wall"]
        if cost / (1 / 30) <= 0.03:  # cheap frames: as fast as allowed, under the share anyway
            assert abs(state["wall"] / 300 - (cost + 1 / 30)) < 1e-9
        elif cost / 1.0 > 0.03:  # frames too costly even at the slowest pace: one a second
            assert abs(state["wall"] / 300 - (cost + 1.0)) < 1e-9
        else:
            assert 0.029 < share < 0.031, (cost, share)


def test_line_blocks_render_as_one_text_when_drawn():
    assert isinstance(LineBlocks([("a\nb", "")]).styled(), Text)
