"""The chat screen's widgets: the prompt box, one chat message, and the stats panel.

A `ChatMessage` streams its answer into a `BlockText` (tui/blocks.py: only the last, unfinished Markdown block is
rendered again, so an update costs what changed, not the whole answer); with token provenance on it shows the raw
text with draft tokens coloured instead, kept up to date beside it line by line. A reasoning model's thinking
streams into a dimmed `ThinkingBlock` above the answer, folded once the answer starts (unless the user keeps
thinking unfolded). A message's images, and those attached to the prompt box, are image_widgets.py's. The stats
panel shows `render_stats`'s text (stats_text.py). Widgets only draw what handlers hand them; none of them knows
about the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from markdown_it import MarkdownIt
from textual import events
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.strip import Strip
from textual.widgets import Collapsible, Static, TextArea

from .attachments import Attachment, pasted_paths
from .blocks import BlockText, LineBlocks, MarkdownBlocks
from .image_widgets import image_views
from .live import Runs, StatsView, add_run
from .safe_text import terminal_safe
from .stats_text import DRAFT_STYLE, TARGET_STYLE, render_stats

ROLE_NAMES = {"user": "you", "assistant": "assistant", "system": "system prompt", "tool": "tool"}
THINKING_KEY = "F8"  # the app's binding that folds and unfolds every thinking block
# A streaming answer's height grows a third of the window at a time (`BlockText.step`; at least 4 lines): each new
# height lays the whole screen out again (~25 ms of the UI thread on 2 cores), which at 4 lines a step was most of
# what the screen cost an answer.
STREAM_STEP = 4
STREAM_STEP_SHARE = 3


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
    elif finish_reason == "interrupted":  # saved as it grew; the app ended before it did
        parts.append("cut short: the chat ended while writing it")
    if stats:
        if stats.get("drafted"):
            parts.append(f"acceptance {stats.get('acceptance_rate', 0):.0%}")
            parts.append(f"{stats.get('mean_tokens_per_pass', 0):.2f} tokens/pass")
        if stats.get("emitted"):
            parts.append(f"{stats.get('tokens_per_second', 0):.1f} tok/s")
    return " · ".join(parts)


class PromptInput(TextArea):
    """The message box: Enter sends, Ctrl+J (or Shift+Enter where the terminal tells them apart) adds a line, ↑/↓ in
    an empty box (or one that shows what they recalled) ask for an earlier prompt (`Recall`)."""

    BINDINGS = [
        Binding("ctrl+j,shift+enter", "newline", "New line", show=False, id="new_line"),
    ]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._typed: list[str] = []  # characters typed and not inserted yet (see `_on_key`)
        self._recalled: str | None = None  # the earlier prompt ↑/↓ put here (while it is unchanged they go on)

    class Submitted(Message):
        """The user pressed Enter."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    class Recall(Message):
        """↑ (`older`) or ↓ in an empty box (`fresh`), or in one that still shows the prompt they recalled."""

        def __init__(self, older: bool, fresh: bool) -> None:
            super().__init__()
            self.older, self.fresh = older, fresh

    class DropImage(Message):
        """Backspace in an empty box: take the last image attached off."""

    def recall(self, text: str) -> None:
        """Show an earlier prompt ("" empties the box), the cursor at its end."""
        text = terminal_safe(text)  # a TextArea draws control characters as they are
        self.text, self._recalled = text, text or None
        self.move_cursor(self.document.end)

    class PastedImages(Message):
        """A paste (a file dropped on the terminal) named image files: attach them instead of typing their paths."""

        def __init__(self, paths: list[Path]) -> None:
            super().__init__()
            self.paths = paths

    async def _on_paste(self, event: events.Paste) -> None:
        paths = pasted_paths(event.text)
        if paths is not None:
            event.stop()
            event.prevent_default()
            self.post_message(self.PastedImages(paths))
            return
        # As `recall`: a paste is drawn as it comes. TextArea's own handler, next in the MRO, inserts it (Textual calls
        # each class's `_on_paste` in turn: calling it here as well typed every paste twice).
        event.text = terminal_safe(event.text)

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
        # Typed characters are gathered and inserted as one edit once the keys already queued are handled: a paste
        # that arrives key by key (tmux send-keys, some remote sessions) re-wrapped the whole line on every key,
        # quadratic in its length, and a quit waited behind the backlog. One key alone is inserted as before, one
        # message later; any other key first inserts what was gathered, so the order of edits is the keys' order.
        if event.is_printable and event.character and event.key != "enter" and not self.read_only:
            event.stop()
            event.prevent_default()
            if not self._typed:
                self.call_later(self.insert_typed)
            self._typed.append(event.character)
            return
        self.insert_typed()
        if event.key == "backspace" and not self.text:  # an empty box: the last image attached goes
            event.stop()
            event.prevent_default()
            self.post_message(self.DropImage())
            return
        if event.key in ("up", "down") and (not self.text or self.text == self._recalled):
            event.stop()
            event.prevent_default()
            self.post_message(self.Recall(event.key == "up", fresh=not self.text))
            return
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self.text))
            return
        await super()._on_key(event)

    def insert_typed(self) -> None:
        """Insert the characters typed since the last insert, as one edit at the cursor (replacing a selection)."""
        if self._typed:
            text = "".join(self._typed)
            self._typed.clear()
            start, end = self.selection
            self._replace_via_keyboard(text, start, end)

    def action_newline(self) -> None:
        """Insert a line break at the cursor."""
        self.insert_typed()
        self.insert("\n")


class ThinkingBlock(Collapsible):
    """A reasoning model's thinking: dimmed text (draft tokens coloured with the answer's), folded on request."""

    def __init__(self, runs: Runs, *, tokens: int | None = None, collapsed: bool = True) -> None:
        self.runs: Runs = list(runs)
        self.tokens = tokens
        self.live = False  # thinking is streaming into it
        self._body = BlockText(LineBlocks(), classes="think-body")
        self._coloured = BlockText(LineBlocks(), classes="think-prov")
        self._started = False  # text was shown (the thinking's leading line breaks are not)
        self._feed(self.runs)
        super().__init__(
            self._body,
            self._coloured,
            title=self._heading(),
            collapsed=collapsed,
            classes="thinking" + ("" if self.runs else " -empty"),
        )

    def _feed(self, runs: Runs) -> None:
        for text, from_draft in runs:
            if not self._started:
                text = text.lstrip()  # the thinking's leading line breaks are not shown
                self._started = bool(text)
            self._body.blocks.feed(text)
            self._coloured.blocks.feed(text, DRAFT_STYLE if from_draft else TARGET_STYLE)

    def _heading(self) -> str:
        if self.live:
            return f"thinking… ({THINKING_KEY} folds)"
        count = f" · {self.tokens} tokens" if self.tokens else ""
        return f"thought{count} ({THINKING_KEY})"

    def add(self, runs: Runs) -> None:
        """Stream more thinking in (shown unfolded while it streams)."""
        for text, from_draft in runs:
            add_run(self.runs, text, from_draft)
        self._feed(runs)
        self._body.changed()
        self._coloured.changed()
        if not self.live:
            self.live = True
            self.remove_class("-empty")
            self.title = self._heading()

    def done(self, runs: Runs, tokens: int | None) -> None:
        """The thinking ended (the answer began, or the turn ended): its final text and token count."""
        if list(runs) != self.runs:  # what was saved differs from what streamed: draw it anew
            self.runs = list(runs)
            self._body.replace(LineBlocks())
            self._coloured.replace(LineBlocks())
            self._started = False
            self._feed(self.runs)
        self.tokens, self.live = tokens, False
        for view in (self._body, self._coloured):
            view.blocks.close()
            view.changed()
        self.set_class(not self.runs, "-empty")
        self.title = self._heading()

    @property
    def text(self) -> str:
        """The thinking as shown (its leading line breaks out)."""
        return self._body.blocks.text().rstrip()


class ChatMessage(Vertical, can_focus=True):
    """One message: its role, a caption, a reasoning model's thinking, and the text (answers as Markdown, or coloured
    by provenance)."""

    BINDINGS = [
        Binding("c", "copy", "Copy message", id="copy_message"),
        Binding("k", "copy_code", "Copy code block", id="copy_code"),
        Binding("e", "request('edit')", "Edit", id="edit_message"),
        Binding("r", "request('regenerate')", "Answer again", id="regenerate_message"),
        Binding("left", "request('branch', -1)", "Previous branch", show=False, id="previous_branch"),
        Binding("right", "request('branch', 1)", "Next branch", show=False, id="next_branch"),
    ]

    class Request(Message):
        """The user asked for something the conversation does: "edit", "regenerate" or "branch" (`step` ±1)."""

        def __init__(self, message: ChatMessage, what: str, step: int = 0) -> None:
            super().__init__()
            self.message, self.what, self.step = message, what, step

    def __init__(
        self,
        role: str,
        text: str = "",
        runs: Runs | None = None,
        *,
        caption: str = "",
        reasoning_runs: Runs | None = None,
        thinking_tokens: int | None = None,
        thinking_expanded: bool = False,
        message_id: int | None = None,
        branch: tuple[int, int] = (1, 1),
        images: Sequence[Attachment] = (),
    ) -> None:
        super().__init__(classes=role)
        self.images = list(images)  # a user message's pictures, shown before its text
        self.role = role
        self.message_id = message_id  # its saved row (None: not saved yet)
        self.branch = branch  # its place among its siblings and how many (shown when more than one)
        self.text = text
        self.runs: Runs = list(runs) if runs else ([(text, False)] if text else [])
        self.caption = caption
        self.reasoning_runs: Runs = list(reasoning_runs or [])
        self.thinking_tokens = thinking_tokens
        self.thinking_expanded = thinking_expanded  # the user keeps thinking unfolded (the app's preference)
        self._next_code = 0
        self._markdown = BlockText(MarkdownBlocks(self.text), classes="md-body")
        self._coloured = BlockText(_coloured(self.runs), classes="prov-body")

    def compose(self):
        yield Static(self._title(), classes="caption", markup=False)
        yield from image_views(self.images, getattr(self.app, "inline_images", None))
        if self.role != "assistant":  # what the user typed, line breaks and all
            yield Static(terminal_safe(self.text), classes="plain-body", markup=False)
            return
        yield ThinkingBlock(self.reasoning_runs, tokens=self.thinking_tokens, collapsed=not self.thinking_expanded)
        yield self._markdown
        yield self._coloured

    def _title(self) -> str:
        place, count = self.branch
        branch = f" · {place}/{count} (←/→)" if count > 1 else ""
        caption = f" · {terminal_safe(self.caption)}" if self.caption else ""  # a tool call's name and arguments
        return ROLE_NAMES.get(self.role, self.role) + branch + caption

    def set_branch(self, branch: tuple[int, int]) -> None:
        """Its place among its siblings changed (an edit, an answer generated again): the caption says it."""
        if branch != self.branch:
            self.branch = branch
            self.query_one(".caption", Static).update(self._title())
            self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """e edits your messages, r answers an answer again, ←/→ only where there are branches (else they scroll)."""
        if action != "request":
            return True
        what = parameters[0] if parameters else ""
        return {"edit": self.role == "user", "regenerate": self.role == "assistant"}.get(what, self.branch[1] > 1)

    def action_request(self, what: str, step: int = 0) -> None:
        """Hand an edit, an answer again or a branch switch to the screen (which asks the conversation)."""
        self.post_message(self.Request(self, what, step))

    @property
    def thinking(self) -> ThinkingBlock | None:
        """The thinking block (assistant messages only)."""
        blocks = self.query(ThinkingBlock)
        return blocks.first() if blocks else None

    async def append(self, runs: Runs, thinking_runs: Runs | None = None, thinking_tokens: int | None = None) -> None:
        """Add streamed text (a chunk's provenance runs): thinking into the block, the answer below it.

        The block shows unfolded while thinking streams and folds when the answer starts (unless the user keeps
        thinking unfolded).
        """
        block = self.thinking
        if thinking_runs and block is not None:
            if not block.live:
                block.collapsed = False
            block.add(thinking_runs)
        if not runs:
            return
        if block is not None and block.live:  # the answer starts: the thinking is done
            block.done(block.runs, thinking_tokens)
            block.collapsed = not self.thinking_expanded
        fragment = "".join(text for text, _ in runs)
        self.text += fragment
        for text, from_draft in runs:
            add_run(self.runs, text, from_draft)
            self._coloured.blocks.feed(text, DRAFT_STYLE if from_draft else TARGET_STYLE)
        self._markdown.blocks.feed(fragment)
        for view in (self._markdown, self._coloured):
            view.step = max(STREAM_STEP, self.app.size.height // STREAM_STEP_SHARE)
            view.changed()

    async def finish(
        self,
        text: str,
        runs: Runs,
        caption: str,
        reasoning_runs: Runs | None = None,
        thinking_tokens: int | None = None,
    ) -> None:
        """The answer ended: its last block becomes final (the text is drawn anew only where it is not what
        streamed)."""
        if text != self.text or list(runs) != self.runs:
            self._markdown.replace(MarkdownBlocks(text))
            self._coloured.replace(_coloured(runs))
        self.text, self.runs, self.caption = text, list(runs), caption
        for view in (self._markdown, self._coloured):
            view.blocks.close()
            view.step = 1
            view.changed()
        self.query_one(".caption", Static).update(self._title())
        block = self.thinking
        if block is not None:
            was_live = block.live
            block.done(list(reasoning_runs or []), thinking_tokens)
            if was_live and text:  # thinking then an answer in the last chunk
                block.collapsed = not self.thinking_expanded

    def set_thinking_expanded(self, expanded: bool) -> None:
        """Fold or unfold the thinking block (the app's key, for every message)."""
        self.thinking_expanded = expanded
        block = self.thinking
        if block is not None and not block.live:
            block.collapsed = not expanded

    def action_copy(self) -> None:
        """Copy the whole message to the clipboard, as shown: what a control sequence hid on screen must not come
        with it into the next terminal it is pasted in."""
        self.app.copy_to_clipboard(terminal_safe(self.text))
        self.notify("copied the message")

    def action_copy_code(self) -> None:
        """Copy the next code block of the message (press again for the one after)."""
        blocks = code_blocks(terminal_safe(self.text))  # as shown (see `action_copy`)
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
        """Draw a stats snapshot (the panel's size is the layout's: nothing else moves)."""
        self.update(render_stats(view), layout=False)


# --- the provenance colours ------------------------------------------------------------------------------


def _coloured(runs: Runs) -> LineBlocks:
    """Answer text with the draft's tokens coloured, as lines."""
    return LineBlocks([(text, DRAFT_STYLE if from_draft else TARGET_STYLE) for text, from_draft in runs])
