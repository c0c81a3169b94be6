"""The chat screen: the messages, the prompt box, the status line and the stats panel, and their handlers.

`ChatScreen` draws what its app's `Conversation` (`app.chat`, no Textual there) holds: a message sent, an answer
streamed in by the worker that generates it (the only worker here; it posts messages, the handlers draw them), a
chat opened, a new chat, the system prompt. The app owns what is not this screen's: loading a pair, the engine slot,
signals and quitting. A reasoning model's thinking streams into its own folded block; F8 folds or unfolds them all,
remembered in the chat database's preferences.
"""

from __future__ import annotations

import logging
import time

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, ProgressBar, Static

from localspec.core.stats import Stats
from localspec.errors import ContextError, LocalspecError

from .conversation import Conversation, Turn
from .failure import error_text
from .live import Chunk, Finished, Reading, StatsView, stream_generation
from .messages import AnswerChunk, AnswerDone, PromptReading, TurnFailed
from .screens import HistoryScreen, TextPromptScreen
from .settings import ChatOptions
from .store import StoredMessage
from .styles import STATS_WIDTH, TOO_SMALL
from .widgets import ChatMessage, PromptInput, StatsPanel, answer_caption

log = logging.getLogger(__name__)

THINKING_PREFERENCE = "thinking_expanded"  # the chat database's preference: thinking blocks stay unfolded


def _thinking_tokens(stats: dict | None) -> int | None:
    """A saved answer's thinking tokens, from its stats (None when it did not think or was saved without them)."""
    parts = (stats or {}).get("parts") or {}
    tokens = (parts.get("thinking") or {}).get("tokens")
    return tokens if isinstance(tokens, int) else None


class ChatScreen(Screen):
    """The conversation on screen and the keys that act on it (each binding has an id for the user's keymap)."""

    BINDINGS = [
        Binding("escape", "stop", "Stop", id="stop"),
        Binding("ctrl+r", "regenerate", "Regenerate", id="regenerate"),
        Binding("ctrl+n", "new_chat", "New chat", id="new_chat"),
        Binding("ctrl+t", "toggle_provenance", "Draft colours", id="draft_colours"),
        Binding("f2", "app.pairs", "Pairs", id="pairs"),
        Binding("f3", "app.settings", "Settings", id="settings"),
        Binding("f4", "history", "Chats", id="chats"),
        Binding("f5", "system_prompt", "System prompt", id="system_prompt"),
        Binding("f6", "copy_answer", "Copy answer", id="copy_answer"),
        # priority: the prompt box (a TextArea) binds F7 itself (select all), and it has the focus
        Binding("f7", "toggle_stats", "Stats panel", show=False, priority=True, id="stats_panel"),
        Binding("f8", "toggle_thinking", "Thinking", show=False, id="thinking"),  # each thinking block's title names it
    ]

    def __init__(self, chat: Conversation, options: ChatOptions) -> None:
        super().__init__()
        self.chat = chat
        self.options = options
        self._live: Chunk | None = None  # the last chunk of the answer being generated
        self._answer: ChatMessage | None = None  # its widget
        self.thinking_expanded = False  # thinking blocks stay unfolded after the answer starts (F8; a preference)
        self._stats_drawn = 0.0  # time.monotonic() of the live stats' last redraw

    # --- layout ---------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield VerticalScroll(id="messages")
                yield Static("", id="status", markup=False)
                yield ProgressBar(id="progress", show_eta=False)
                yield PromptInput(
                    id="prompt", soft_wrap=True, placeholder="Message (Enter sends · Ctrl+J new line · Esc stops)"
                )
            yield StatsPanel(id="stats")
        yield Static(TOO_SMALL, id="too-small", markup=False)
        yield Footer()

    async def on_mount(self) -> None:
        prompt = self.query_one(PromptInput)
        prompt.cursor_blink = self.options.cursor_blink
        prompt.focus()
        self._messages.anchor()
        self.thinking_expanded = self.chat.store.preference(THINKING_PREFERENCE, False) is True
        self._stats_timer = self.set_interval(self.options.stats_interval, self._refresh_stats, pause=True)
        await self.show_conversation()
        self.draw_stats()

    @property
    def _messages(self) -> VerticalScroll:
        return self.query_one("#messages", VerticalScroll)

    def set_status(self, text: str) -> None:
        """Say `text` on the status line (one line, whatever it says)."""
        self.query_one("#status", Static).update(text, layout=False)

    def progress(self, on: bool, total: float | None = None, done: float = 0) -> None:
        """Show (`on`) or hide the progress bar; `total` None is a bar of unknown length."""
        bar = self.query_one("#progress", ProgressBar)
        bar.set_class(on, "-on")
        # An indeterminate bar (total None) animates 15 times a second even while hidden: stop it when off.
        bar.update(total=total if on else 1, progress=done)

    def ready_text(self) -> str:
        """The status line when nothing is under way."""
        if self.chat.loaded is None:
            return "ready"
        pair = self.chat.loaded.pair
        demo = (
            " (the offline demo pair: a demo of the mechanism, not a good chat model)" if pair.defaults.notice else ""
        )
        return f"ready · {pair.label}{demo}"

    def error(self, message: str) -> None:
        """Show a one-line error."""
        log.info("shown to the user: %s", message)
        self.notify(message, severity="error", timeout=8)

    def tell(self, notices: list[str]) -> None:
        """Show each notice as a warning."""
        for notice in notices:
            self.notify(notice, severity="warning", timeout=12)

    def busy(self, what: str) -> bool:
        """True (and say why) when an answer or a load is in the way of `what`."""
        why = self.chat.busy(what)
        if why:
            self.notify(why, severity="warning")
        return why is not None

    def _view(self, generating: bool) -> StatsView:
        live = self._live if generating else None
        turn = live.stats if live else self.chat.last_turn
        return StatsView(
            turn=turn,
            session=self.chat.session_stats,
            turns=self.chat.answers,
            tokens_per_second_now=live.tokens_per_second_now if live else 0.0,
            tokens_per_second_turn=(live.tokens_per_second_turn if live else turn.tokens_per_second if turn else 0.0),
            generating=generating,
            drafter=self.chat.settings.drafter,
            draft_max=self.chat.settings.spec.draft_max,
            adaptive=self.chat.settings.spec.adaptive,
            provenance=self.has_class("-provenance"),
            drafting_note=self.chat.loaded.engine.drafting_note if self.chat.loaded else "",
            parts=live.parts if live else self.chat.last_parts,
        )

    def draw_stats(self, view: StatsView | None = None) -> None:
        """Redraw the stats panel (default: the chat's last answer and session figures)."""
        self.query_one(StatsPanel).show(view or self._view(generating=False))

    def _refresh_stats(self, *, due: bool = False) -> None:
        """Redraw the live stats, at most every `stats_interval` (`due`: whenever asked). A chunk's frame draws them
        with the text, in one screen refresh; the timer only when no chunk came for that long."""
        if self.chat.turn is None or self._live is None:
            return
        now = time.monotonic()
        if due or now - self._stats_drawn >= self.options.stats_interval * 0.9:
            self._stats_drawn = now
            self.draw_stats(self._view(generating=True))

    # --- the conversation -----------------------------------------------------------------------------------

    async def show_conversation(self, stored: list[StoredMessage] | None = None) -> None:
        """Redraw the message list from the conversation (or from stored messages, which carry provenance)."""
        await self._messages.remove_children()
        system = self.chat.system
        widgets = [ChatMessage("system", system)] if system else []
        expanded = self.thinking_expanded
        if stored is not None:
            widgets += [
                ChatMessage(
                    m.role,
                    m.content,
                    m.provenance,
                    caption=answer_caption(m.stats, m.finish_reason) if m.role == "assistant" else "",
                    reasoning_runs=m.reasoning_provenance or ([(m.reasoning, False)] if m.reasoning else []),
                    thinking_tokens=_thinking_tokens(m.stats),
                    thinking_expanded=expanded,
                )
                for m in stored
            ]
        else:
            widgets += [
                ChatMessage(
                    m.role,
                    m.content,
                    reasoning_runs=[(m.reasoning, False)] if m.reasoning else [],
                    thinking_expanded=expanded,
                )
                for m in self.chat.dialogue
            ]
        if widgets:
            await self._messages.mount_all(widgets)
        self._messages.scroll_end(animate=False)

    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        text = event.text.rstrip()  # leading spaces may be code indentation
        if not text.strip() or self.busy("send another message"):
            return
        if self.chat.session is None:
            self.error("no model is loaded: pick a pair (F2)")
            return
        try:
            turn = self.chat.send(text)
        except LocalspecError as e:  # not saved: the text stays in the prompt box
            self.error(str(e))
            return
        self.query_one(PromptInput).clear()
        self.tell(self.chat.take_notices())
        await self._messages.mount(ChatMessage("user", text))
        await self._start_turn(turn)

    async def _start_turn(self, turn: Turn) -> None:
        self._answer = ChatMessage("assistant", thinking_expanded=self.thinking_expanded)
        await self._messages.mount(self._answer)
        self._messages.scroll_end(animate=False)
        self._live = None
        self.set_status("generating… (Esc stops)")
        self._stats_timer.resume()
        self._generate(turn)

    @work(thread=True, group="generate", exit_on_error=False)
    def _generate(self, turn: Turn) -> None:
        with self.app.slot.using():
            try:
                generation = turn.begin()
            except Exception as e:  # never leave the turn hanging
                self.post_message(TurnFailed(turn.id, error_text(e, "starting the answer")))
                return

            def emit(item: Chunk | Reading | Finished) -> None:
                if isinstance(item, Chunk):
                    turn.gate.sent()
                    self.post_message(AnswerChunk(turn.id, item))
                elif isinstance(item, Reading):
                    self.post_message(PromptReading(turn.id, item))
                else:
                    self.post_message(AnswerDone(turn.id, item))

            stream_generation(
                generation, emit, split=turn.split, ready=turn.gate.ready, interval=self.options.stream_interval
            )

    async def on_answer_chunk(self, message: AnswerChunk) -> None:
        if self.chat.turn is None or message.turn_id != self.chat.turn.id or self._answer is None:
            return
        turn, first = self.chat.turn, self._live is None
        self._live = message.chunk
        chunk = message.chunk
        self.chat.grow(chunk)  # saved as it grows, every few seconds
        thinking_tokens = chunk.parts["thinking"].tokens if chunk.parts else None
        try:
            await self._answer.append(chunk.runs, chunk.thinking_runs, thinking_tokens)
            self._refresh_stats(due=first)
        finally:
            self.set_timer(turn.gate.budget.pause(), turn.gate.drawn)

    def on_prompt_reading(self, message: PromptReading) -> None:
        if self.chat.turn is not None and message.turn_id == self.chat.turn.id:
            self.set_status(message.reading.status())

    async def on_answer_done(self, message: AnswerDone) -> None:
        if self.chat.turn is None or message.turn_id != self.chat.turn.id:
            return
        finished = message.finished
        budget = self.chat.turn.gate.budget
        log.info("screen: %d frames, the UI thread at %.1f %% of a core", budget.frames, 100 * budget.used)
        if self._answer is not None:
            await self._answer.finish(
                finished.text,
                finished.runs,
                answer_caption(finished.stats.to_dict(), finished.reason),
                finished.reasoning_runs,
                finished.parts["thinking"].tokens if finished.parts else None,
            )
            if self.chat.turn is None or message.turn_id != self.chat.turn.id:
                return  # a second signal during that await quit at once and saved what was shown
        self._answer, self._live = None, None
        self._stats_timer.pause()
        try:
            self.chat.finish(finished)
            not_saved = None
        except LocalspecError as e:
            not_saved = str(e)
        self.draw_stats()
        self.set_status(self.ready_text())
        if not_saved:
            self.error(not_saved)
        self.tell(self.chat.take_notices())
        for notice in finished.notices:
            self.notify(notice, severity="warning", timeout=10)
        if finished.error:
            self.error(finished.error)
        self.app.answer_ended()

    async def on_turn_failed(self, message: TurnFailed) -> None:
        turn = self.chat.turn
        if turn is None or message.turn_id != turn.id:
            return
        self.chat.fail(turn)
        self._live = None
        self._stats_timer.pause()
        if self._answer is not None:
            await self._answer.remove()
            self._answer = None
        if turn.kind == "send":  # the message goes back into the prompt box (the conversation took it back)
            users = self._messages.query(ChatMessage).filter(".user")
            if users:
                await users.last().remove()
            self.query_one(PromptInput).text = turn.text
        self.set_status(self.ready_text())
        self.error(message.error)
        self.app.answer_ended()

    def save_shown_answer(self) -> None:
        """Quitting before the stopped answer came back from the worker: save what the screen shows of it, as
        stopped (the worker's own `Finished` would have been saved instead, had it come)."""
        shown, turn = self._answer, self.chat.turn
        if shown is None or turn is None:
            return
        block = shown.thinking
        reasoning_runs = list(block.runs) if block is not None else []
        if not (shown.text or reasoning_runs):
            return
        live = self._live
        finished = Finished(
            text=shown.text,
            runs=list(shown.runs),
            finish_reason="cancelled",
            stats=live.stats if live is not None else Stats(),
            notices=[],
            reasoning="".join(text for text, _ in reasoning_runs).strip(),
            reasoning_runs=reasoning_runs,
            parts=live.parts if live is not None else None,
        )
        self._answer, self._live = None, None
        try:
            self.chat.finish(finished)
        except LocalspecError as e:
            log.warning("the stopped answer could not be saved: %s", e)

    # --- actions --------------------------------------------------------------------------------------------

    def action_stop(self) -> None:
        """Stop the answer being generated (Esc)."""
        if self.chat.stop():
            self.set_status("stopping…")
        else:
            self.query_one(PromptInput).focus()

    async def action_regenerate(self) -> None:
        """Generate the last answer again."""
        if self.busy("regenerate") or self.chat.session is None:
            return
        try:
            turn = self.chat.regenerate()
        except ContextError as e:
            self.notify(str(e), severity="warning")
            return
        answers = self._messages.query(ChatMessage).filter(".assistant")
        if turn.replaces_answer and answers:
            await answers.last().remove()
        await self._start_turn(turn)

    async def action_new_chat(self) -> None:
        """Start a new conversation (the system prompt stays)."""
        if self.busy("start a new chat"):
            return
        self.chat.new()
        self.draw_stats()
        await self.show_conversation()
        self.set_status(f"new chat · {self.chat.loaded.pair.label}" if self.chat.loaded else "new chat")

    def action_toggle_provenance(self) -> None:
        """Colour draft tokens (and back to Markdown)."""
        self.toggle_class("-provenance")
        on = self.has_class("-provenance")
        self.draw_stats(self._view(generating=self.chat.turn is not None and self._live is not None))
        self.notify("draft tokens in green, target tokens plain" if on else "answers shown as Markdown")

    def action_toggle_thinking(self) -> None:
        """Fold or unfold every thinking block, and keep them so for the answers to come (F8; remembered)."""
        self.thinking_expanded = not self.thinking_expanded
        for message in self._messages.query(ChatMessage).filter(".assistant"):
            message.set_thinking_expanded(self.thinking_expanded)
        try:
            self.chat.store.set_preference(THINKING_PREFERENCE, self.thinking_expanded)
        except LocalspecError as e:
            self.error(str(e))
        self.notify("thinking stays unfolded" if self.thinking_expanded else "thinking folds when the answer starts")

    def action_toggle_stats(self) -> None:
        """Show or hide the stats panel."""
        self.query_one(StatsPanel).toggle_class("-hidden")
        if not self.has_class("-wide"):
            self.notify(f"the stats panel shows in a window {STATS_WIDTH} columns wide or more", severity="warning")

    def action_copy_answer(self) -> None:
        """Copy the last answer."""
        answers = self._messages.query(ChatMessage).filter(".assistant")
        if not answers:
            self.notify("no answer to copy yet", severity="warning")
            return
        answers.last().action_copy()

    def action_copy_code(self) -> None:
        """Copy a code block of the last answer."""
        answers = self._messages.query(ChatMessage).filter(".assistant")
        if answers:
            answers.last().action_copy_code()

    def action_history(self) -> None:
        """Open the saved conversations."""
        self.app.push_screen(
            HistoryScreen(self.chat.store, self.chat.saved_id, self.options.export_dir), self._history_closed
        )

    async def _history_closed(self, result: tuple[str, int] | None) -> None:
        if result is None:
            return
        what, cid = result
        if what == "deleted":
            self.chat.forget(cid)
            await self.action_new_chat()
        elif what == "resume":
            await self.resume(cid)

    async def resume(self, cid: int) -> None:
        """Open saved chat `cid` (what the chats list's resume does); refused while an answer or load runs."""
        if self.busy("open another chat"):
            return
        try:
            conversation, stored = self.chat.open(cid)
        except LocalspecError as e:
            self.error(str(e))
            return
        self.draw_stats()
        await self.show_conversation(stored)
        here = self.chat.loaded.pair.name if self.chat.loaded else None
        if conversation.pair and here and conversation.pair != here:
            self.notify(f"this chat was with {conversation.pair}; it continues with {here} (F2 switches)")
        self.set_status(f"resumed {conversation.title!r}")

    def action_system_prompt(self) -> None:
        """Edit the system prompt."""
        self.app.push_screen(
            TextPromptScreen(
                "System prompt (for this and new chats)",
                self.chat.system,
                multiline=True,
                cursor_blink=self.options.cursor_blink,
            ),
            self._system_saved,
        )

    async def _system_saved(self, text: str | None) -> None:
        if text is None or self.busy("change the system prompt"):
            return
        self.chat.set_system(text)
        await self.show_conversation(self.chat.saved_messages())
        self.notify("system prompt set" if self.chat.system else "system prompt removed")
