"""The chat app: `make_app(options)` builds it for both `localspec chat` and the tests.

`ChatApp` is widgets and wiring: the conversation, the loaded pair, the settings and the chat database
belong to its `Conversation` (`conversation`, no Textual there), which the handlers below call and then
draw. Loading, pulling and generating run in Textual thread workers that only post messages (see
`messages`); the handlers are the only code that changes widgets. One lock is held by whichever worker
uses the engine, so the engine is closed (on quit or on a pair switch) only when nothing is running on it.
Quitting — Ctrl+Q, or SIGTERM / SIGHUP (a `kill`, a closed terminal) — stops an answer as Esc does and
waits for it to be saved as stopped before the app exits through Textual, which restores the terminal.
A reasoning model's thinking streams into its own folded block; F8 folds or unfolds them all, remembered in the
chat database's preferences.
"""

from __future__ import annotations

import logging
import signal
import time

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, ProgressBar, Static

from localspec.core.stats import Stats
from localspec.errors import ContextError, LocalspecError
from localspec.models.resolved import ResolvedPair
from localspec.paths import get_paths

from . import loading, signals
from .conversation import Conversation, Turn
from .failure import error_text
from .live import Chunk, Finished, Reading, StatsView, stream_generation
from .messages import (
    AnswerChunk,
    AnswerDone,
    EngineReady,
    LoadFailed,
    LoadProgress,
    PromptReading,
    PullBytes,
    PullDone,
    TurnFailed,
)
from .screens import ConfirmScreen, HistoryScreen, PairScreen, SettingsScreen, TextPromptScreen
from .settings import ChatOptions, ChatSettings
from .slot import EngineSlot
from .store import ChatStore, StoredMessage
from .styles import CSS, HORIZONTAL_BREAKPOINTS, STATS_WIDTH, TOO_SMALL, VERTICAL_BREAKPOINTS
from .widgets import ChatMessage, PromptInput, StatsPanel, answer_caption

log = logging.getLogger(__name__)

STOP_WAIT = 10.0  # seconds a quit waits for the stopped answer to come back and be saved
THINKING_PREFERENCE = "thinking_expanded"  # the chat database's preference: thinking blocks stay unfolded


def _thinking_tokens(stats: dict | None) -> int | None:
    """A saved answer's thinking tokens, from its stats (None when it did not think or was saved without them)."""
    parts = (stats or {}).get("parts") or {}
    tokens = (parts.get("thinking") or {}).get("tokens")
    return tokens if isinstance(tokens, int) else None


class ChatApp(App[int]):
    """Chat with a target + draft pair and watch speculative decoding work."""

    TITLE = "localspec"
    CSS = CSS
    # Any window size: the screens get a width and a height class (see `styles`), so a narrow window hides the
    # stats panel and one below the minimum shows a single line instead of a chat squeezed to no width.
    HORIZONTAL_BREAKPOINTS = HORIZONTAL_BREAKPOINTS
    VERTICAL_BREAKPOINTS = VERTICAL_BREAKPOINTS
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+r", "regenerate", "Regenerate"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+t", "toggle_provenance", "Draft colours"),
        Binding("f2", "pairs", "Pairs"),
        Binding("f3", "settings", "Settings"),
        Binding("f4", "history", "Chats"),
        Binding("f5", "system_prompt", "System prompt"),
        Binding("f6", "copy_answer", "Copy answer"),
        # priority: the prompt box (a TextArea) binds F7 itself (select all), and it has the focus
        Binding("f7", "toggle_stats", "Stats panel", show=False, priority=True),
        Binding("f8", "toggle_thinking", "Thinking", show=False),  # each thinking block's title names it
    ]

    def __init__(self, options: ChatOptions, store: ChatStore, notices: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.options = options
        self.notices = notices  # shown once the app is up (e.g. that the last run crashed in llama.cpp)
        self.chat = Conversation(options, store)
        self._live: Chunk | None = None  # the last chunk of the answer being generated
        self._answer: ChatMessage | None = None  # its widget
        self.slot = EngineSlot()
        self.signalled: int | None = None  # SIGTERM or SIGHUP, once one asked the app to quit
        self._quit_code: int | None = None  # the exit code of a quit that waits for the answer to stop
        self._signals: signals.Watch | None = None  # the handlers this app installed
        self._hung_up = False  # SIGHUP came with the terminal gone: the output goes to /dev/null
        self.thinking_expanded = False  # thinking blocks stay unfolded after the answer starts (F8; a preference)
        self._stats_drawn = 0.0  # time.monotonic() of the live stats' last redraw

    def get_driver_class(self):
        """Textual's terminal driver for this platform; on Linux and macOS the one whose Esc never types "^"."""
        driver = super().get_driver_class()
        if driver.__module__ != "textual.drivers.linux_driver":  # Windows, or a driver chosen by TEXTUAL_DRIVER
            return driver
        from .keys import ChatDriver  # imports termios: not on Windows

        return ChatDriver

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
        self._signals = signals.watch(self._signalled, at_once=self._hung_up_now)
        self.slot.open()
        prompt = self.query_one(PromptInput)
        prompt.cursor_blink = self.options.cursor_blink
        prompt.focus()
        self.query_one("#messages", VerticalScroll).anchor()
        self.thinking_expanded = self.chat.store.preference(THINKING_PREFERENCE, False) is True
        self._stats_timer = self.set_interval(self.options.stats_interval, self._refresh_stats, pause=True)
        await self._show_conversation()
        self.draw_stats()
        for notice in self.notices:
            self.notify(notice, severity="warning", timeout=20)
        self._start_load(pair=None)

    def get_system_commands(self, screen: Screen):
        """The command palette (Ctrl+P): the app's actions next to Textual's own."""
        yield from super().get_system_commands(screen)
        for title, help_text, action in (
            ("New chat", "Start a new conversation", self.action_new_chat),
            ("Regenerate", "Generate the last answer again", self.action_regenerate),
            ("Switch pair", "Load another target + draft pair", self.action_pairs),
            ("Settings", "Sampling and speculation settings", self.action_settings),
            ("Saved chats", "Resume, rename, delete or export a conversation", self.action_history),
            ("System prompt", "Set the system prompt", self.action_system_prompt),
            ("Copy answer", "Copy the last answer", self.action_copy_answer),
            ("Copy code block", "Copy the last code block of the last answer", self.action_copy_code),
            ("Draft colours", "Colour the tokens that came from the draft", self.action_toggle_provenance),
            ("Thinking", "Fold or unfold reasoning models' thinking (F8)", self.action_toggle_thinking),
        ):
            yield SystemCommand(title, help_text, action)

    @property
    def _messages(self) -> VerticalScroll:
        return self.query_one("#messages", VerticalScroll)

    def _set_status(self, text: str) -> None:
        self.query_one("#status", Static).update(text, layout=False)  # one line, whatever it says

    def _progress(self, on: bool, total: float | None = None, done: float = 0) -> None:
        bar = self.query_one("#progress", ProgressBar)
        bar.set_class(on, "-on")
        # An indeterminate bar (total None) animates 15 times a second even while hidden: stop it when off.
        bar.update(total=total if on else 1, progress=done)

    def _ready_text(self) -> str:
        if self.chat.loaded is None:
            return "ready"
        pair = self.chat.loaded.pair
        demo = (
            " (the offline demo pair: a demo of the mechanism, not a good chat model)" if pair.defaults.notice else ""
        )
        return f"ready · {pair.label}{demo}"

    def _error(self, message: str) -> None:
        log.info("shown to the user: %s", message)
        self.notify(message, severity="error", timeout=8)

    def _tell(self, notices: list[str]) -> None:
        for notice in notices:
            self.notify(notice, severity="warning", timeout=12)

    def _busy(self, what: str) -> bool:
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
            provenance=self.screen.has_class("-provenance"),
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

    # --- loading and pulling --------------------------------------------------------------------------------

    def _start_load(
        self, pair: str | None, *, choice: ResolvedPair | None = None, settings: ChatSettings | None = None
    ) -> None:
        """Unload the current engine (if any) and load another in a worker, with progress.

        `settings` (a drafter change) choose the drafter and apply once loaded; default the pair's own.
        """
        old = self.chat.begin_load(settings)
        self.draw_stats()
        self._set_status("loading…")
        self._progress(True)
        self._load_worker(old, pair, choice, settings.drafter if settings else None)

    @work(thread=True, group="load", exit_on_error=False)
    def _load_worker(self, old, pair: str | None, choice: ResolvedPair | None, drafter: str | None) -> None:
        def load() -> loading.Loaded:
            resolved = choice or loading.choose_models(self.options, pair, self._post_progress)
            return loading.load_models(self.options, resolved, drafter, self._post_progress)

        try:
            loaded = self.slot.replace(old, load)
        except Exception as e:  # an engine bug too: one line, never a traceback over the chat
            self.post_message(LoadFailed(error_text(e, "loading")))
            return
        if loaded is not None:
            self.post_message(EngineReady(loaded))

    def _post_progress(self, text: str) -> None:
        self.post_message(LoadProgress(text))

    def on_load_progress(self, message: LoadProgress) -> None:
        self._set_status(message.text)

    def on_pull_bytes(self, message: PullBytes) -> None:
        self._progress(True, message.total, message.done)
        total = f" of {message.total / 2**20:.0f} MiB" if message.total else ""
        name = message.filename.rsplit("/", 1)[-1]  # the label may be a shortened URL
        self._set_status(f"downloading {name}: {message.done / 2**20:.0f} MiB{total}")

    def on_engine_ready(self, message: EngineReady) -> None:
        loaded = message.loaded
        if self.slot.closing:
            loaded.engine.close()
            return
        self._progress(False)
        try:
            notices = self.chat.attach(loaded)  # on failure the pair stays loaded, so that a switch unloads it
        except LocalspecError as e:
            self._set_status("no chat possible with this model: pick another pair (F2)")
            self._error(str(e))
            return
        self.sub_title = loaded.pair.label
        self._set_status(self._ready_text())
        self.draw_stats()
        if loaded.pair.defaults.notice:
            self.notify(loaded.pair.defaults.notice, severity="warning", timeout=12)
        plan = loaded.engine.plan  # a context the plan shortened is said, never silent
        for notice in (*notices, *(plan.warnings if plan is not None else ())):
            self.notify(notice, severity="warning", timeout=12)

    def on_load_failed(self, message: LoadFailed) -> None:
        fallback = None
        if message.pulled:
            self.chat.pull_ended()
        else:
            fallback = self.chat.load_failed()
        if fallback is not None:  # a switch that failed: the pair that worked comes back
            self._error(f"{message.error}; loading {fallback.label} again")
            self._start_load(fallback.name, choice=fallback, settings=self.chat.settings)
            return
        self._progress(False)
        ready = self.chat.session is not None
        self._set_status(self._ready_text() if ready else "no model loaded: pick a pair (F2)")
        self._error(message.error)

    def _start_pull(self, name: str) -> None:
        self.chat.begin_pull(name)
        self._set_status(f"pulling {name}…")
        self._progress(True)
        self._pull_worker(name)

    @work(thread=True, group="pull", exit_on_error=False)
    def _pull_worker(self, name: str) -> None:
        def on_bytes(filename: str, done: int, total: int | None) -> None:
            self.post_message(PullBytes(filename, done, total))

        try:
            loading.pull(self.options, name, self._post_progress, on_bytes)
        except Exception as e:
            self.post_message(LoadFailed(error_text(e, "the download"), pulled=True))
            return
        self.post_message(PullDone(name))

    def on_pull_done(self, message: PullDone) -> None:
        load_now = self.chat.pull_ended(pulled=True)
        self.notify(f"pair {message.pair} is downloaded")
        if load_now:
            self._start_load(message.pair)

    # --- the conversation ---------------------------------------------------------------------------------------

    async def _show_conversation(self, stored: list[StoredMessage] | None = None) -> None:
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
        if not text.strip() or self._busy("send another message"):
            return
        if self.chat.session is None:
            self._error("no model is loaded: pick a pair (F2)")
            return
        try:
            turn = self.chat.send(text)
        except LocalspecError as e:  # not saved: the text stays in the prompt box
            self._error(str(e))
            return
        self.query_one(PromptInput).clear()
        self._tell(self.chat.take_notices())
        await self._messages.mount(ChatMessage("user", text))
        await self._start_turn(turn)

    async def _start_turn(self, turn: Turn) -> None:
        self._answer = ChatMessage("assistant", thinking_expanded=self.thinking_expanded)
        await self._messages.mount(self._answer)
        self._messages.scroll_end(animate=False)
        self._live = None
        self._set_status("generating… (Esc stops)")
        self._stats_timer.resume()
        self._generate(turn)

    @work(thread=True, group="generate", exit_on_error=False)
    def _generate(self, turn: Turn) -> None:
        self.slot.run(lambda: self._answer_turn(turn))  # on the engine thread (EngineSlot: one for llama.cpp)

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
            self._set_status(message.reading.status())

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
        self._set_status(self._ready_text())
        if not_saved:
            self._error(not_saved)
        self._tell(self.chat.take_notices())
        for notice in finished.notices:
            self.notify(notice, severity="warning", timeout=10)
        if finished.error:
            self._error(finished.error)
        if self._quit_code is not None:  # the answer a quit stopped is saved: now quit
            self.exit(return_code=self._quit_code)

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
        self._set_status(self._ready_text())
        self._error(message.error)
        if self._quit_code is not None:
            self.exit(return_code=self._quit_code)

    # --- actions --------------------------------------------------------------------------------------------

    def action_stop(self) -> None:
        """Stop the answer being generated (Esc)."""
        if self.chat.stop():
            self._set_status("stopping…")
        else:
            self.query_one(PromptInput).focus()

    async def action_regenerate(self) -> None:
        """Generate the last answer again."""
        if self._busy("regenerate") or self.chat.session is None:
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
        if self._busy("start a new chat"):
            return
        self.chat.new()
        self.draw_stats()
        await self._show_conversation()
        self._set_status(f"new chat · {self.chat.loaded.pair.label}" if self.chat.loaded else "new chat")

    def action_toggle_provenance(self) -> None:
        """Colour draft tokens (and back to Markdown)."""
        self.screen.toggle_class("-provenance")
        on = self.screen.has_class("-provenance")
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
            self._error(str(e))
        self.notify("thinking stays unfolded" if self.thinking_expanded else "thinking folds when the answer starts")

    def action_toggle_stats(self) -> None:
        """Show or hide the stats panel."""
        self.query_one(StatsPanel).toggle_class("-hidden")
        if not self.screen.has_class("-wide"):
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

    def action_pairs(self) -> None:
        """Open the pair switcher."""
        if self._busy("switch pairs"):
            return
        if self.chat.pulling is not None:
            self.notify("a pair is being downloaded: wait for it to finish", severity="warning")
            return
        try:
            rows = loading.list_pairs(self.options)
        except LocalspecError as e:
            self._error(str(e))
            return
        current = self.chat.loaded.pair.name if self.chat.loaded else None
        plan = self.chat.loaded.engine.plan if self.chat.loaded else None
        placement = plan.describe() if plan is not None else ""
        self.push_screen(PairScreen(rows, current, placement), lambda name: self._pair_picked(name, rows))

    def _pair_picked(self, name: str | None, rows: list[loading.PairRow]) -> None:
        if name is None or self._busy("switch pairs"):
            return
        row = next(r for r in rows if r.name == name)
        if row.fix:  # a local file that is missing: nothing to download
            self._error(row.fix)
            return
        what = self.chat.pick_pair(name, downloaded=row.ready)
        if what == "loaded":
            self.notify(f"{name} is already loaded")
            return
        if what == "load":
            self._start_load(name)
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self._start_pull(name)

        self.push_screen(
            ConfirmScreen(
                f"Pair {name} is not downloaded ({row.status}). Download it now, as `localspec pull {name}` would?"
            ),
            answer,
        )

    def action_settings(self) -> None:
        """Open the settings form."""
        screen = SettingsScreen(
            self.chat.settings,
            cursor_blink=self.options.cursor_blink,
            thinking=self.chat.thinking if self.chat.loaded else None,
            default_think=self.chat.default_think,
        )
        self.push_screen(screen, self._settings_saved)

    def _settings_saved(self, settings: ChatSettings | None) -> None:
        if settings is None:
            return
        try:
            reload = self.chat.apply_settings(settings)
        except LocalspecError as e:
            self._error(str(e))
            return
        if not reload:
            self.draw_stats()
            self.notify("settings apply from the next message")
            return
        if self._busy("change the drafter"):
            return
        self._start_load(self.chat.loaded.pair.name, choice=self.chat.loaded.pair, settings=settings)

    def action_history(self) -> None:
        """Open the saved conversations."""
        self.push_screen(
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
        if self._busy("open another chat"):
            return
        try:
            conversation, stored = self.chat.open(cid)
        except LocalspecError as e:
            self._error(str(e))
            return
        self.draw_stats()
        await self._show_conversation(stored)
        here = self.chat.loaded.pair.name if self.chat.loaded else None
        if conversation.pair and here and conversation.pair != here:
            self.notify(f"this chat was with {conversation.pair}; it continues with {here} (F2 switches)")
        self._set_status(f"resumed {conversation.title!r}")

    def action_system_prompt(self) -> None:
        """Edit the system prompt."""
        self.push_screen(
            TextPromptScreen(
                "System prompt (for this and new chats)",
                self.chat.system,
                multiline=True,
                cursor_blink=self.options.cursor_blink,
            ),
            self._system_saved,
        )

    async def _system_saved(self, text: str | None) -> None:
        if text is None or self._busy("change the system prompt"):
            return
        self.chat.set_system(text)
        await self._show_conversation(self.chat.saved_messages())
        self.notify("system prompt set" if self.chat.system else "system prompt removed")

    # --- shutdown -------------------------------------------------------------------------------------------

    async def action_quit(self) -> None:
        """Quit (Ctrl+Q): an answer being generated is stopped first and saved, as Esc would."""
        self.quit_saving(0)

    def quit_saving(self, code: int) -> None:
        """Exit with `code` once the answer being generated (if any) is stopped and saved as stopped.

        A worker that does not hand the answer back within `STOP_WAIT` is not waited for any longer.
        """
        if self._quit_code is not None:  # asked twice: quit now, with what the screen shows of the answer saved
            self._save_shown_answer()
            self.exit(return_code=code)
            return
        self._quit_code = code
        if not self.chat.stop():
            self.exit(return_code=code)
            return
        self._set_status("stopping the answer, then quitting…")
        self.set_timer(STOP_WAIT, lambda: (self._save_shown_answer(), self.exit(return_code=code)))

    def _save_shown_answer(self) -> None:
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

    def _hung_up_now(self, signum: int) -> None:
        """In the signal handler: after a hangup, output goes to /dev/null before the loop writes again (it would
        block for ever on the dead terminal's output thread before reaching `_signalled`)."""
        if signum == signal.SIGHUP and signals.terminal_gone():
            self._hung_up = True
            signals.discard_output(self._driver)

    def _signalled(self, signum: int) -> None:
        """SIGTERM or SIGHUP: quit as Ctrl+Q does, with the shell's exit code (143, 129)."""
        log.info("%s: stopping the answer, then quitting", signal.Signals(signum).name)
        self.signalled = self.signalled or signum
        self.quit_saving(128 + self.signalled)

    def exit(self, *args, **kwargs) -> None:
        if self._hung_up:  # an output thread may have died since the signal (Textual starts one on SIGCONT)
            signals.discard_output(self._driver)
        super().exit(*args, **kwargs)

    async def on_unmount(self) -> None:
        """Stop the answer, wait for the worker that holds the engine, then free the models and the store."""
        if self.signalled is None:  # after a signal they stay (a second one then quits at once) till the loop ends
            signals.unwatch(self._signals)
        try:
            await self.slot.close(self.chat.stop, self.chat.detach)
        finally:
            self.chat.close()


def make_app(options: ChatOptions, *, store: ChatStore | None = None, notices: tuple[str, ...] = ()) -> ChatApp:
    """Build the chat app (the CLI and the tests both come through here).

    Args:
        options: what to load and where files go.
        store: an open chat database; default the one at `options.db_path` or `get_paths().db_path`.
        notices: lines to show as warnings when the app is up (the CLI's notes, which the app's screen would hide).

    Raises:
        LocalspecError: the chat database cannot be opened.
    """
    store = store or ChatStore(options.db_path or get_paths().db_path)
    return ChatApp(options, store, notices)


__all__ = ["ChatApp", "ChatOptions", "ChatSettings", "make_app"]
