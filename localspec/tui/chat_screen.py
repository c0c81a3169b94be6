"""The chat screen: the messages, the prompt box, the status line and the stats panel, and their handlers.

`ChatScreen` draws what its app's `Conversation` (`app.chat`, no Textual there) holds: a message sent, an answer
streamed in by the worker that generates it (the only worker here; it posts messages, the handlers draw them), a
chat opened, a new chat, the system prompt. The app owns what is not this screen's: loading a pair, the engine thread,
signals and quitting. A reasoning model's thinking streams into its own folded block; F8 folds or unfolds them all,
remembered in the chat database's preferences. Two parts of this screen are base classes of its own: the images
attached to the message being written (`Attaching`, attaching.py) and opening saved chats (`SavedChats`,
saved_chats.py).
"""

from __future__ import annotations

import logging
import time

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Header, ProgressBar, Static

from localspec.errors import ContextError, LocalspecError

from .attaching import Attaching
from .conversation import Conversation, Turn
from .failure import error_text
from .image_widgets import AttachmentBar
from .live import Chunk, Finished, Reading, StatsView, stream_generation
from .message_list import MessageList, saved_widget, shown_widget
from .messages import AnswerChunk, AnswerDone, PromptReading, TurnFailed
from .safe_text import terminal_safe
from .saved_chats import SavedChats
from .screens import TextPromptScreen
from .search import PromptHistory
from .settings import ChatOptions
from .stats_text import stats_view
from .store import StoredMessage
from .styles import STATS_WIDTH, TOO_SMALL
from .tool_flow import ToolFlow
from .widgets import ChatMessage, PromptInput, StatsPanel, answer_caption

log = logging.getLogger(__name__)

THINKING_PREFERENCE = "thinking_expanded"  # the chat database's preference: thinking blocks stay unfolded


class ChatScreen(SavedChats, Attaching):
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
        Binding("ctrl+o", "attach_image", "Image", id="attach_image"),
        Binding("ctrl+l", "paste_image", "Paste image", show=False, id="paste_image"),
        # priority: the prompt box (a TextArea) binds F7 itself (select all), and it has the focus
        Binding("f7", "toggle_stats", "Stats panel", show=False, priority=True, id="stats_panel"),
        Binding("f8", "toggle_thinking", "Thinking", show=False, id="thinking"),  # each thinking block's title names it
        Binding("ctrl+f", "search", "Search", show=False, id="search"),
    ]

    def __init__(self, chat: Conversation, options: ChatOptions) -> None:
        super().__init__()
        self.chat = chat
        self.options = options
        self._live: Chunk | None = None  # the last chunk of the answer being generated
        self._answer: ChatMessage | None = None  # its widget
        self.thinking_expanded = False  # thinking blocks stay unfolded after the answer starts (F8; a preference)
        self._stats_drawn = 0.0  # time.monotonic() of the live stats' last redraw
        self._history = PromptHistory(chat.store)  # ↑/↓ in an empty prompt box

    # --- layout ---------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield MessageList(id="messages")
                yield Static("", id="status", markup=False)
                yield ProgressBar(id="progress", show_eta=False)
                yield AttachmentBar(id="attachments")
                yield PromptInput(
                    id="prompt", soft_wrap=True, placeholder="Message (Enter sends · Ctrl+J new line · Esc stops)"
                )
            yield StatsPanel(id="stats")
        yield ToolFlow()  # an answer's tool calls: asked, run, answered (tool_flow.py)
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
    def _messages(self) -> MessageList:
        return self.query_one(MessageList)

    def set_status(self, text: str) -> None:
        """Say `text` on the status line (one line, whatever it says: a tool's name, a chat's title)."""
        self.query_one("#status", Static).update(terminal_safe(text), layout=False)

    def progress(self, on: bool, total: float | None = None, done: float = 0) -> None:
        """Show (`on`) or hide the progress bar; `total` None is a bar of unknown length."""
        bar = self.query_one("#progress", ProgressBar)
        bar.set_class(on, "-on")
        # An indeterminate bar (total None) animates 15 times a second even while hidden: stop it when off.
        bar.update(total=total if on else 1, progress=done)

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
        return stats_view(self.chat, self._live if generating else None, provenance=self.has_class("-provenance"))

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

    async def show_conversation(self, stored: list[StoredMessage] | None = None, start: int = 0) -> None:
        """Redraw the message list from the conversation (or from stored messages, which carry provenance), from
        the dialogue's message `start` on (0: all of it)."""
        expanded = self.thinking_expanded
        if stored is not None:
            store = self.chat.store
            widgets = [saved_widget(m, expanded, store.attachments(m) if m.images else ()) for m in stored[start:]]
        else:
            shown = zip(self.chat.dialogue[start:], self.chat.ids[start:], strict=True)
            widgets = [shown_widget(m, i, expanded, self.chat.attachments(m)) for m, i in shown]
        await self._messages.show(self.chat.system, widgets, start)
        self._messages.scroll_end(animate=False)

    def _show_branches(self) -> None:
        """The captions' `2/3` from the saved tree (after a turn ended or a branch began)."""
        if self.chat.saved_id is not None:
            self._messages.show_branches(self.chat.store.branches(self.chat.saved_id))

    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        text = event.text.rstrip()  # leading spaces may be code indentation
        bar = self.query_one(AttachmentBar)
        images = bar.attachments
        if not (text.strip() or images) or self.busy("send another message"):
            return
        if self.chat.session is None:
            self.error("no model is loaded: pick a pair (F2)")
            return
        try:
            turn = self.chat.send(text, images)
        except LocalspecError as e:  # not saved: the text and the images stay in the prompt box
            self.error(str(e))
            return
        self.query_one(PromptInput).clear()
        await bar.clear()
        self.tell(self.chat.take_notices())
        await self._messages.mount(ChatMessage("user", text, message_id=self.chat.ids[-1], images=images))
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
        self.app.engine_thread.run(lambda: self._answer_turn(turn))  # on the one engine thread (llama.cpp's)

    def _answer_turn(self, turn: Turn) -> None:
        """Generate the turn's answer, posting its chunks, its prompt's reading and its end (on the engine thread)."""
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
        finished, shown = message.finished, self._answer
        budget = self.chat.turn.gate.budget
        log.info("screen: %d frames, the UI thread at %.1f %% of a core", budget.frames, 100 * budget.used)
        if shown is not None:
            await shown.finish(
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
        if shown is not None:
            shown.message_id = self.chat.ids[-1]
        self._show_branches()
        self.draw_stats()
        self.set_status(self.chat.ready_text())
        if not_saved:
            self.error(not_saved)
        self.tell(self.chat.take_notices())
        for notice in finished.notices:
            self.notify(notice, severity="warning", timeout=10)
        if finished.error:
            self.error(finished.error)
        if not await self.query_one(ToolFlow).after_answer(shown):
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
        prompt = self.query_one(PromptInput)
        if turn.kind == "send":  # the message goes back into the prompt box (the conversation took it back)
            users = self._messages.query(ChatMessage).filter(".user")
            if users:
                await users.last().remove()
            prompt.text = turn.text
            await self.query_one(AttachmentBar).add(turn.images)
        elif turn.kind == "edit":  # the old branch comes back, the edited text goes to the prompt box
            await self.show_conversation(self.chat.saved_messages(), turn.at if self.chat.saved_id else 0)
            if not prompt.text:
                prompt.text = turn.text
            prompt.focus()
        self.set_status(self.chat.ready_text())
        self.error(message.error)
        self.app.answer_ended()

    def save_shown_answer(self) -> None:
        """Quitting before the stopped answer came back from the worker: save what the screen shows of it, as
        stopped (the worker's own `Finished` would have been saved instead, had it come)."""
        shown, turn = self._answer, self.chat.turn
        if shown is None or turn is None:
            return
        reasoning_runs = list(shown.thinking.runs) if shown.thinking is not None else []
        if not (shown.text or reasoning_runs):
            return
        finished = Finished.stopped(shown.text, shown.runs, reasoning_runs, self._live)
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

    async def action_regenerate(self, message_id: int | None = None) -> None:
        """Generate the last answer (or answer `message_id`) again, as a new branch beside it."""
        if self.busy("regenerate") or self.chat.session is None:
            return
        try:
            turn = self.chat.regenerate(message_id)
        except ContextError as e:
            self.notify(str(e), severity="warning")
            return
        await self._messages.cut(turn.at)
        if self.focused is None:  # `r` on an answer: it went, the prompt box takes the keys
            self.query_one(PromptInput).focus()
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
        if answers:
            answers.last().action_copy()
        else:
            self.notify("no answer to copy yet", severity="warning")

    def action_copy_code(self) -> None:
        """Copy a code block of the last answer."""
        if answers := self._messages.query(ChatMessage).filter(".assistant"):
            answers.last().action_copy_code()

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

    def on_prompt_input_recall(self, event: PromptInput.Recall) -> None:
        text = self._history.step(event.older, fresh=event.fresh)
        if text is not None:
            self.query_one(PromptInput).recall(text)

    async def on_chat_message_request(self, event: ChatMessage.Request) -> None:
        """A selected message's e (edit), r (answer again), ←/→ (its siblings' branches)."""
        message_id = event.message.message_id
        verb = {"edit": "edit a message", "regenerate": "regenerate", "branch": "switch branches"}[event.what]
        if self.busy(verb):  # a branch switch never stops an answer: Esc does, then the switch
            return
        if message_id is None:
            self.notify("this message is not saved: it has no branches to edit or switch", severity="warning")
        elif event.what == "regenerate":
            await self.action_regenerate(message_id)
        elif event.what == "edit" and event.message.role != "user":
            self.notify("only your own messages can be edited: r answers again instead", severity="warning")
        elif event.what == "edit":
            title = "Edit your message (sent as a new branch; the old one is kept)"
            screen = TextPromptScreen(title, event.message.text, multiline=True, cursor_blink=self.options.cursor_blink)
            self.app.push_screen(screen, lambda text: self._edited(message_id, text))
        else:
            await self._switch(message_id, event.step)

    async def _edited(self, message_id: int, text: str | None) -> None:
        if text is None or self.busy("edit a message"):
            return
        try:
            turn = self.chat.edit(message_id, text)
        except LocalspecError as e:  # an empty edit, a message no longer on screen, a database that is locked
            self.error(str(e))
            return
        await self._messages.cut(turn.at)  # the selected message went with them: the prompt box takes the keys
        images = self.chat.attachments(self.chat.dialogue[-1])  # the edit shows the pictures the message showed
        await self._messages.mount(ChatMessage("user", turn.text, message_id=turn.message_id, images=images))
        self.query_one(PromptInput).focus()
        self._show_branches()
        await self._start_turn(turn)

    async def _switch(self, message_id: int, step: int) -> None:
        try:
            switched = self.chat.switch(message_id, step)
        except LocalspecError as e:
            self.error(str(e))
            return
        if switched is None:
            self.notify(f"no other branch {'before' if step < 0 else 'after'} this one", severity="warning")
            return
        start, stored = switched
        await self.show_conversation(stored, start)
        self._show_branches()
        self.draw_stats()  # the branch's own length in the context
        self._messages.reveal(self.chat.ids[start])
