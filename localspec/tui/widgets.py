"""The chat screen's widgets: the prompt box, one chat message, and the stats panel.

A `ChatMessage` streams its answer through Textual's `MarkdownStream` (fragments are batched, blocks
already parsed are not re-rendered) and re-renders once when the answer ends so code fences come out
right; with token provenance on it shows the raw text with draft tokens coloured instead. Widgets only
draw what handlers hand them; none of them knows about the engine.
"""

from __future__ import annotations

from markdown_it import MarkdownIt
from textual import events
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.strip import Strip
from textual.widgets import Markdown, Static, TextArea
from textual.widgets.markdown import MarkdownStream

from .live import Runs, StatsView, add_run, provenance_text, render_stats

ROLE_NAMES = {"user": "you", "assistant": "assistant", "system": "system prompt"}


def code_blocks(markdown: str) -> list[str]:
    """The contents of the fenced and indented code blocks in a Markdown text, in order."""
    return [t.content for t in MarkdownIt("commonmark").parse(markdown) if t.type in ("fence", "code_block")]


def answer_caption(stats: dict | None, finish_reason: str | None) -> str:
    """The line under an answer's role: how it ended and how speculation did."""
    parts = []
    if finish_reason == "cancelled":
        parts.append("stopped")
    elif finish_reason == "length":
        parts.append("cut at max tokens")
    elif finish_reason == "error":
        parts.append("failed")
    if stats:
        if stats.get("drafted"):
            parts.append(f"acceptance {stats.get('acceptance_rate', 0):.0%}")
            parts.append(f"{stats.get('mean_tokens_per_pass', 0):.2f} tokens/pass")
        if stats.get("emitted"):
            parts.append(f"{stats.get('tokens_per_second', 0):.1f} tok/s")
    return " · ".join(parts)


class PromptInput(TextArea):
    """The message box: Enter sends, Ctrl+J (or Shift+Enter where the terminal tells them apart) adds a line."""

    BINDINGS = [
        Binding("ctrl+j,shift+enter", "newline", "New line", show=False),
    ]

    class Submitted(Message):
        """The user pressed Enter."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def render_line(self, y: int) -> Strip:
        # Textual 8.2's TextArea wraps its placeholder to the content width, and rich's `chop_cells` steps by
        # that width: a box squeezed to no columns (a window resized narrower than the layout has caught up
        # with) raised "range() arg 3 must not be zero" and ended the app. Nothing can be drawn there anyway.
        if self.content_size.width < 1:
            return Strip.blank(0)
        return super().render_line(y)

    def on_show(self) -> None:
        # A window below the app's minimum size hides the chat, and the hidden box loses the focus: take it back
        # when the window grows again, or the next keys would go nowhere.
        if self.screen.focused is None:
            self.focus()

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self.text))
            return
        await super()._on_key(event)

    def action_newline(self) -> None:
        """Insert a line break at the cursor."""
        self.insert("\n")


class ChatMessage(Vertical, can_focus=True):
    """One message: its role, a caption, and the text (answers as Markdown, or coloured by provenance)."""

    BINDINGS = [
        Binding("c", "copy", "Copy message"),
        Binding("k", "copy_code", "Copy code block"),
    ]

    def __init__(self, role: str, text: str = "", runs: Runs | None = None, *, caption: str = "") -> None:
        super().__init__(classes=role)
        self.role = role
        self.text = text
        self.runs: Runs = list(runs) if runs else ([(text, False)] if text else [])
        self.caption = caption
        self._stream: MarkdownStream | None = None
        self._next_code = 0

    def compose(self):
        yield Static(self._title(), classes="caption", markup=False)
        if self.role != "assistant":  # what the user typed, line breaks and all
            yield Static(self.text, classes="plain-body", markup=False)
            return
        yield Markdown(self.text, classes="md-body")
        yield Static(provenance_text(self.runs), classes="prov-body")

    def _title(self) -> str:
        return ROLE_NAMES.get(self.role, self.role) + (f" · {self.caption}" if self.caption else "")

    @property
    def _markdown(self) -> Markdown:
        return self.query_one(".md-body", Markdown)

    def _provenance_on(self) -> bool:
        return self.role == "assistant" and self.screen.has_class("-provenance")

    async def append(self, runs: Runs) -> None:
        """Add streamed text (a chunk's provenance runs)."""
        fragment = "".join(text for text, _ in runs)
        self.text += fragment
        for text, from_draft in runs:
            add_run(self.runs, text, from_draft)
        if self._stream is None:
            self._stream = Markdown.get_stream(self._markdown)
        await self._stream.write(fragment)
        if self._provenance_on():
            self.refresh_provenance()

    async def finish(self, text: str, runs: Runs, caption: str) -> None:
        """The answer ended: stop streaming and render the whole text once (code fences included)."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.text, self.runs, self.caption = text, list(runs), caption
        await self._markdown.update(text)
        self.query_one(".caption", Static).update(self._title())
        self.refresh_provenance()

    def refresh_provenance(self) -> None:
        """Redraw the coloured view (after a toggle, or as text streams while it is shown)."""
        if self.role == "assistant":
            self.query_one(".prov-body", Static).update(provenance_text(self.runs))

    def action_copy(self) -> None:
        """Copy the whole message to the clipboard."""
        self.app.copy_to_clipboard(self.text)
        self.notify("copied the message")

    def action_copy_code(self) -> None:
        """Copy the next code block of the message (press again for the one after)."""
        blocks = code_blocks(self.text)
        if not blocks:
            self.notify("this message has no code block", severity="warning")
            return
        index = self._next_code % len(blocks)
        self._next_code = index + 1
        self.app.copy_to_clipboard(blocks[index])
        self.notify(f"copied code block {index + 1} of {len(blocks)}")


class StatsPanel(Static):
    """The live speculation numbers (see `render_stats`)."""

    def show(self, view: StatsView) -> None:
        """Draw a stats snapshot."""
        self.update(render_stats(view))
