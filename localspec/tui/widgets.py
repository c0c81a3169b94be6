"""The chat screen's widgets: the prompt box, one chat message, and the stats panel.

A `ChatMessage` streams its answer into a `BlockText` (tui/blocks.py: only the last, unfinished Markdown block is
rendered again, so an update costs what changed, not the whole answer); with token provenance on it shows the raw
text with draft tokens coloured instead, kept up to date beside it line by line. A reasoning model's thinking
streams into a dimmed `ThinkingBlock` above the answer, folded once the answer starts (unless the user keeps
thinking unfolded). `render_stats` draws the stats panel's text from a `StatsView`. Widgets only draw what
handlers hand them; none of them knows about the engine.
"""

from __future__ import annotations

from markdown_it import MarkdownIt
from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.strip import Strip
from textual.widgets import Collapsible, Static, TextArea

from localspec.core.stats import Stats
from localspec.core.thinking import ANSWER, THINKING, PartStats

from .blocks import BlockText, LineBlocks, MarkdownBlocks
from .live import Runs, StatsView, add_run

BAR_WIDTH = 12
DRAFT_STYLE = "bold green"  # tokens the draft proposed and the target accepted
TARGET_STYLE = ""  # tokens the target produced itself
ROLE_NAMES = {"user": "you", "assistant": "assistant", "system": "system prompt"}
THINKING_KEY = "F8"  # the app's binding that folds and unfolds every thinking block
STREAM_STEP = 4  # lines a streaming answer's height grows by at a time (`BlockText.step`)


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
    """The message box: Enter sends, Ctrl+J (or Shift+Enter where the terminal tells them apart) adds a line."""

    BINDINGS = [
        Binding("ctrl+j,shift+enter", "newline", "New line", show=False, id="new_line"),
    ]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._typed: list[str] = []  # characters typed and not inserted yet (see `_on_key`)

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
    ]

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
    ) -> None:
        super().__init__(classes=role)
        self.role = role
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
        if self.role != "assistant":  # what the user typed, line breaks and all
            yield Static(self.text, classes="plain-body", markup=False)
            return
        yield ThinkingBlock(self.reasoning_runs, tokens=self.thinking_tokens, collapsed=not self.thinking_expanded)
        yield self._markdown
        yield self._coloured

    def _title(self) -> str:
        return ROLE_NAMES.get(self.role, self.role) + (f" · {self.caption}" if self.caption else "")

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
            view.step = STREAM_STEP
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
        """Draw a stats snapshot (the panel's size is the layout's: nothing else moves)."""
        self.update(render_stats(view), layout=False)


# --- the stats panel's text and the provenance colours ------------------------------------------------------


def _coloured(runs: Runs) -> LineBlocks:
    """Answer text with the draft's tokens coloured, as lines."""
    return LineBlocks([(text, DRAFT_STYLE if from_draft else TARGET_STYLE) for text, from_draft in runs])


def _bar(fraction: float, width: int = BAR_WIDTH) -> str:
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * filled + "░" * (width - filled)


def _usual_draft_length(turn: Stats) -> int:
    """The draft length most steps used (k ≥ 1), else the longest one drafted."""
    by_k = getattr(turn, "steps_by_draft_length", [])
    counts = [(n, k) for k, n in enumerate(by_k) if k >= 1 and n]
    return max(counts)[1] if counts else len(turn.drafted_by_position) or turn.draft_length


def _speculation_line(view: StatsView) -> tuple[str, str, str]:
    """(verdict, why it is off or "", style) for the speculation row."""
    turn = view.turn
    if view.drafter == "none":
        return "off", "no drafter", "yellow"
    if turn is not None and turn.target_passes:
        if turn.speculation_off:
            return "off", turn.speculation_off, "yellow"
        k = turn.draft_length if view.generating else _usual_draft_length(turn)
        return f"on, draft length {k}", "", "green"
    if view.draft_max == 0:
        return "off", "draft max is 0", "yellow"
    return f"on, draft length ≤ {view.draft_max}", "", "green"


def _row(text: Text, label: str, value: str, style: str = "") -> None:
    text.append(label + " " * max(1, 14 - cell_len(label)), "dim")
    text.append(value + "\n", style)


def render_stats(view: StatsView) -> Text:
    """The stats panel: this answer's numbers, time split, acceptance by draft position, the session."""
    text = Text()
    text.append("this answer" + (" (live)" if view.generating else "") + "\n", "bold")
    verdict, why, style = _speculation_line(view)
    if len(why) > 20:  # a long reason (the adaptive policy explains itself) goes on its own line
        _row(text, "speculation", verdict, style)
        text.append(f"  {why}\n", "dim")
    else:
        _row(text, "speculation", f"{verdict} ({why})" if why else verdict, style)
    _row(text, "drafter", f"{view.drafter}, max {view.draft_max}" + (" adaptive" if view.adaptive else " fixed"))
    if view.drafting_note and view.drafter != "none":
        text.append(f"  {view.drafting_note}\n", "dim")
    turn = view.turn or Stats()
    if turn.drafted:
        _row(text, "acceptance", f"{turn.acceptance_rate:.0%} ({turn.accepted}/{turn.drafted})", "bold")
    else:
        _row(text, "acceptance", "–")
    _row(text, "α per token", f"{turn.alpha:.2f}" if turn.drafted else "–")
    _row(text, "tokens/pass", f"{turn.mean_tokens_per_pass:.2f}" if turn.target_passes else "–")
    _row(text, "tok/s now", f"{view.tokens_per_second_now:.1f}" if view.generating else "–")
    _row(text, "tok/s turn", f"{view.tokens_per_second_turn:.1f}" if turn.emitted else "–")
    _row(text, "tokens", f"{turn.emitted} in {turn.target_passes} passes")
    _parts_lines(text, view.parts)
    decision = turn.decision
    if view.adaptive and decision.predicted_speedup > 0:  # what the adaptive policy decides from
        _row(text, "c · v(k) · α̂", f"{decision.draft_cost:.2f} · {decision.verify_cost:.2f} · {decision.alpha:.2f}")
        measured = f"{decision.measured_speedup:.2f}×" if decision.measured_speedup else "–"
        _row(text, "speed-up", f"{decision.predicted_speedup:.2f}× pred, {measured} real")
    _time_split(text, turn)
    text.append("\nacceptance by draft position\n", "bold")
    rates = turn.acceptance_by_position
    if not rates:
        text.append("  nothing drafted yet\n", "dim")
    for i, rate in enumerate(rates, start=1):
        text.append(f"{i:>3} ")
        text.append(_bar(rate), "green")
        text.append(f" {rate:>4.0%}\n")
    _session_lines(text, view)
    if view.provenance:
        text.append("\n■ draft token", DRAFT_STYLE)
        text.append("  ■ target token\n")
    return text


def _parts_lines(text: Text, parts: dict[str, PartStats] | None) -> None:
    """Thinking and answer side by side, for an answer that thought (DESIGN §10)."""
    if not parts or not parts[THINKING].tokens:
        return
    thinking, answer = parts[THINKING], parts[ANSWER]

    def both(value) -> str:
        return f"{value(thinking):>8} {value(answer):>8}"

    text.append("\n" + " " * 14 + f"{'thinking':>8} {'answer':>8}\n", "bold")
    _row(text, "tokens", both(lambda p: str(p.tokens)))
    _row(text, "acceptance", both(lambda p: f"{p.acceptance_rate:.0%}" if p.drafted else "–"))
    _row(text, "tokens/pass", both(lambda p: f"{p.tokens_per_pass:.2f}" if p.passes else "–"))


def _time_split(text: Text, turn: Stats) -> None:
    parts = {
        "draft": turn.seconds_draft,
        "verify": turn.seconds_verify,
        "sample": turn.seconds_sampling,
        "other": turn.seconds_other,
    }
    total = sum(parts.values())
    text.append("\ntime split\n", "bold")
    if total <= 0:
        text.append("  nothing timed yet\n", "dim")
        return
    for name, seconds in parts.items():
        text.append(f"  {name:<7}")
        text.append(_bar(seconds / total), "cyan")
        text.append(f" {seconds / total:>4.0%}\n")


def _session_lines(text: Text, view: StatsView) -> None:
    session = view.session
    text.append("\nsession\n", "bold")
    if not view.turns:
        text.append("  no answers yet\n", "dim")
        return
    _row(text, "answers", str(view.turns))
    _row(text, "acceptance", f"{session.acceptance_rate:.0%}" if session.drafted else "–")
    _row(text, "tokens/pass", f"{session.mean_tokens_per_pass:.2f}" if session.target_passes else "–")
    _row(text, "tok/s", f"{session.tokens_per_second:.1f}")
