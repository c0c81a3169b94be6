"""A message's text drawn as blocks whose rendered lines are kept (`BlockText`): a streamed answer re-renders only
its last, unfinished block, so an update costs what changed, not the whole answer, and a message body is one
widget however long it grows — Textual's own Markdown widget mounts a widget per block, and every widget on the
screen is laid out again on each update, so its cost grew with the answer and with the conversation (issue 42).

Markdown is cut into top-level blocks with markdown-it: a block is final once the next one starts (as Textual's
streaming Markdown decides it). Plain and draft-coloured text are cut into lines. Each block is rendered by Rich at
the widget's width once; a new width renders them all again.
"""

from __future__ import annotations

from typing import Protocol

from markdown_it import MarkdownIt
from rich.console import RenderableType
from rich.markdown import Markdown
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

from .safe_text import terminal_safe

CODE_THEME = "monokai"


class Blocks(Protocol):
    """A growing text cut into blocks: the finished ones never change, the tail is re-rendered until it is."""

    finished: list[RenderableType]  # append-only
    gap: int  # blank lines between two blocks (a rendered block's own blank lines at its ends are dropped then)

    def tail(self) -> RenderableType | None:
        """The block still growing (None when there is none)."""
        ...

    def close(self) -> None:
        """The text is complete: the tail becomes a finished block."""
        ...

    def text(self) -> str:
        """Everything fed so far, as plain text."""
        ...


class MarkdownBlocks:
    """Markdown cut into its top-level blocks (paragraphs, lists, fences, headings, tables, quotes)."""

    gap = 1

    def __init__(self, source: str = "") -> None:
        self.finished: list[RenderableType] = []
        self._source: list[str] = []  # everything fed
        self._tail = ""  # the source from the first line of the unfinished block on
        self._parser = MarkdownIt("gfm-like")
        if source:
            self.feed(source)

    def feed(self, fragment: str) -> None:
        """Add text at the end; blocks that the new text shows to be complete become finished."""
        self._source.append(fragment)
        self._tail += fragment
        tops = [t.map[0] for t in self._parser.parse(self._tail) if t.map is not None and t.level == 0]
        if len(tops) < 2:
            return
        lines = self._tail.splitlines(keepends=True)
        for start, end in zip(tops, tops[1:]):
            self.finished.append(_markdown("".join(lines[start:end])))
        self._tail = "".join(lines[tops[-1] :])

    def tail(self) -> RenderableType | None:
        return _markdown(self._tail) if self._tail.strip() else None

    def close(self) -> None:
        block = self.tail()
        if block is not None:
            self.finished.append(block)
        self._tail = ""

    def text(self) -> str:
        return "".join(self._source)


def _markdown(source: str) -> Markdown:
    # the whole block's source, so that a control sequence split between two streamed chunks goes whole
    return Markdown(terminal_safe(source).strip("\n"), code_theme=CODE_THEME)


class LineBlocks:
    """Text cut into lines (each wraps at the width), with a style per piece: a user's message, thinking, or an
    answer with the draft's tokens coloured."""

    gap = 0

    def __init__(self, pieces: list[tuple[str, str]] | None = None) -> None:
        self.finished: list[Text] = []
        self._line = Text()
        self._closed = False
        for text, style in pieces or []:
            self.feed(text, style)

    def feed(self, text: str, style: str = "") -> None:
        """Add text in `style` at the end (as it can be drawn: `terminal_safe`); each line break finishes a line."""
        *complete, rest = terminal_safe(text).split("\n")
        for piece in complete:
            self._line.append(piece, style)
            self.finished.append(self._line)
            self._line = Text()
        self._line.append(rest, style)

    def tail(self) -> RenderableType | None:
        return self._line if self._line else None

    def close(self) -> None:
        if self._line:
            self.finished.append(self._line)
        self._line, self._closed = Text(), True

    def text(self) -> str:
        return self.styled().plain

    def styled(self) -> Text:
        """Everything fed so far, one `Text` with its styles."""
        return Text("\n").join(self.finished if self._closed else [*self.finished, self._line])


def _blank(line: list[Segment]) -> bool:
    return all(not seg.text.strip() and not (seg.style and seg.style.bgcolor) for seg in line)


class BlockText(Widget):
    """Draws `Blocks` (Textual's line API): the finished blocks' lines are rendered once per width and kept.

    Call `changed()` after feeding the blocks; set `step` above 1 while text streams in (see there).
    """

    DEFAULT_CSS = "BlockText { height: auto; }"

    def __init__(self, blocks: Blocks, *, classes: str = "") -> None:
        super().__init__(classes=classes)
        self.blocks = blocks
        # While text streams in, the height grows `step` lines at a time (blank lines below the text): a new
        # height lays the whole screen out again, which costs more than the update itself.
        self.step = 1
        self._width = -1
        self._lines: list[Strip] = []  # the finished blocks' lines at _width
        self._rendered = 0  # finished blocks in _lines
        self._tail: list[Strip] | None = None  # the tail's lines at _width (None: not rendered since it changed)
        self._laid_out = 0  # the height the last layout gave this widget
        self._style = Style()

    def replace(self, blocks: Blocks) -> None:
        """Draw other text (renders it all once)."""
        self.blocks = blocks
        self._width, self._tail = -1, None
        self.refresh(layout=True)

    def changed(self) -> None:
        """The blocks grew: render what is new, and lay the screen out again only when the height changed."""
        if self._width < 0 or not self.display:
            self._tail = None
            return  # not laid out yet, or hidden: the next layout renders what is new
        first = len(self._lines)  # the old tail's first line: everything above it is unchanged
        self._tail = None
        self._update(self._width)
        height = len(self._lines) + len(self._tail or ())
        if self._padded(height) != self._laid_out:
            self.refresh(layout=True)
        elif height > first:
            self.refresh(Region(0, first, self._width, height - first))

    def _render(self, renderable: RenderableType, width: int) -> list[Strip]:
        console = self.app.console
        options = console.options.update(width=width, height=None, highlight=False)
        lines = console.render_lines(renderable, options, pad=False)
        if self.blocks.gap:
            # Rich opens a list, a quote or a table with a blank line and may end one with another; the gap between
            # blocks is ours. A code block's padding has a background and stays.
            while lines and _blank(lines[0]):
                lines.pop(0)
            while lines and _blank(lines[-1]):
                lines.pop()
        return [Strip(line) for line in lines]

    def _update(self, width: int) -> None:
        if width != self._width:
            self._width, self._lines, self._rendered, self._tail = width, [], 0, None
        gap = [Strip.blank(width)] * self.blocks.gap
        while self._rendered < len(self.blocks.finished):
            if self._lines and gap:
                self._lines.extend(gap)
            self._lines.extend(self._render(self.blocks.finished[self._rendered], width))
            self._rendered += 1
        if self._tail is None:
            tail = self.blocks.tail()
            self._tail = [] if tail is None else (gap if self._lines else []) + self._render(tail, width)

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return container.width

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        self._update(width)
        self._laid_out = self._padded(len(self._lines) + len(self._tail or ()))
        return self._laid_out

    def _padded(self, lines: int) -> int:
        return -(-lines // self.step) * self.step

    def render_lines(self, crop: Region) -> list[Strip]:
        self._style = self.rich_style  # once per repaint: it walks the ancestors' styles
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        width = self.content_size.width
        self._update(width)
        if y < len(self._lines):
            line = self._lines[y]
        elif self._tail is not None and y - len(self._lines) < len(self._tail):
            line = self._tail[y - len(self._lines)]
        else:
            line = Strip.blank(width)
        return line.crop_extend(0, width, None).apply_style(self._style)
