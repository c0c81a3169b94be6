"""The chat app: `make_app(options)` builds it for both `localspec chat` and the tests.

`ChatApp` owns what outlives a screen: the `Conversation` (`conversation`, no Textual there: the messages, the
loaded pair, the settings and the chat database), loading and pulling pairs, the engine thread, the user's keys,
signals and quitting. Its one screen, `ChatScreen` (chat_screen.py, the default screen), owns the chat's widgets and
their handlers. Loading, pulling and generating run in Textual thread workers that only post messages (see
`messages`); the handlers are the only code that changes widgets. One lock is held by whichever worker uses the
engine, so the engine is closed (on quit or on a pair switch) only when nothing is running on it. Quitting — Ctrl+Q,
or SIGTERM / SIGHUP (a `kill`, a closed terminal) — stops an answer as Esc does and waits for it to be saved as
stopped before the app exits through Textual, which restores the terminal.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from types import FrameType

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.content import Content
from textual.markup import MarkupError
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widget import Widget

from localspec.errors import LocalspecError
from localspec.models.resolved import ResolvedPair
from localspec.paths import get_paths

from . import loading, signals
from .chat_screen import ChatScreen
from .conversation import Conversation
from .engine_thread import EngineThread
from .failure import error_text
from .image_widgets import probe_inline_images
from .keymap import KEYS_FILE, bound_ids, load_keymap
from .mcp_client import McpHub
from .messages import EngineReady, LoadFailed, LoadProgress, McpReady, PullBytes, PullDone
from .safe_text import terminal_safe
from .screens import ConfirmScreen, PairScreen, SettingsScreen
from .settings import ChatOptions, ChatSettings
from .store import ChatStore
from .styles import HORIZONTAL_BREAKPOINTS, VERTICAL_BREAKPOINTS
from .widgets import ChatMessage, PromptInput

log = logging.getLogger(__name__)

STOP_WAIT = 10.0  # seconds a quit waits for the stopped answer to come back and be saved


# Textual's own notices, written in its markup: the quit hint a Ctrl+C shows, and the screenshot's (the command
# palette's "Screenshot"). Named, not "any call from Textual": a callback Textual runs (`call_later(self.notify, …)`)
# or an action string (`app.notify(…)`) may carry outside text.
TEXTUAL_NOTICES = frozenset({"action_help_quit", "_on_delivery_complete", "_on_delivery_failed"})


def textual_markup(message: str, caller: FrameType | None) -> bool:
    """Whether a notification is one of Textual's own (`TEXTUAL_NOTICES`) and its markup parses; `caller` is the
    frame that called `ChatApp.notify` (Textual's `Widget.notify`, which hands a screen's call on, is looked past)."""
    while caller is not None and caller.f_code.co_name == "notify" and _in_textual(caller):
        caller = caller.f_back
    if caller is None or caller.f_code.co_name not in TEXTUAL_NOTICES or not _in_textual(caller):
        return False
    try:
        Content.from_markup(message)
    except MarkupError:  # e.g. a screenshot's path holding "[/": drawn as it is
        return False
    return True


def _in_textual(frame: FrameType) -> bool:
    return str(frame.f_globals.get("__name__", "")).startswith("textual.")


class ChatApp(App[int]):
    """Chat with a target + draft pair and watch speculative decoding work."""

    TITLE = "localspec"
    CSS_PATH = "chat.tcss"
    # Any window size: the screens get a width and a height class (see `styles`), so a narrow window hides the
    # stats panel and one below the minimum shows a single line instead of a chat squeezed to no width.
    HORIZONTAL_BREAKPOINTS = HORIZONTAL_BREAKPOINTS
    VERTICAL_BREAKPOINTS = VERTICAL_BREAKPOINTS
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", show=False, priority=True, id="quit"),
        Binding("ctrl+c", "help_quit", show=False, system=True),
    ]

    def __init__(
        self,
        options: ChatOptions,
        store: ChatStore,
        notices: tuple[str, ...] = (),
        inline_images: Callable[..., Widget] | None = None,
    ) -> None:
        super().__init__()
        self.options = options
        self.inline_images = inline_images  # the widget that draws an image in this terminal (None: chips only)
        self.notices = notices  # shown once the app is up (e.g. that the last run crashed in llama.cpp)
        self.chat = Conversation(options, store)
        self.chat_screen: ChatScreen  # made when the app starts (the default screen)
        self.engine_thread = EngineThread()
        self.mcp: McpHub | None = None  # the MCP servers' client, once they are asked to start
        self.signalled: int | None = None  # SIGTERM or SIGHUP, once one asked the app to quit
        self._quit_code: int | None = None  # the exit code of a quit that waits for the answer to stop
        self._signals: signals.Watch | None = None  # the handlers this app installed
        self._hung_up = False  # SIGHUP came with the terminal gone: the output goes to /dev/null
        keymap, warnings = load_keymap(options.paths.config_dir / KEYS_FILE, binding_groups())
        self.set_keymap(keymap)
        self.notices = (*notices, *warnings)

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """Every toast of the chat (a widget's and a screen's `notify` come here). Ours are drawn as data, never as
        Textual markup, whatever `markup` says — a tool's error, a file's name or a model's notice may hold `[/`,
        which ended the app, or `[@click=…]`, which became an action. Textual's own (the quit hint on Ctrl+C, the
        screenshot's notice) are its markup, and are drawn as such where it parses (`textual_markup`)."""
        safe, title = terminal_safe(str(message)), terminal_safe(title)
        markup = markup and textual_markup(safe, sys._getframe(1))
        super().notify(safe, title=title, severity=severity, timeout=timeout, markup=markup)

    def get_default_screen(self) -> Screen:
        self.chat_screen = ChatScreen(self.chat, self.options)
        return self.chat_screen

    def get_driver_class(self):
        """Textual's terminal driver for this platform; on Linux and macOS the one whose Esc never types "^"."""
        driver = super().get_driver_class()
        if driver.__module__ != "textual.drivers.linux_driver":  # Windows, or a driver chosen by TEXTUAL_DRIVER
            return driver
        from .keys import ChatDriver  # imports termios: not on Windows

        return ChatDriver

    async def on_mount(self) -> None:
        self._signals = signals.watch(self._signalled, at_once=self._hung_up_now)
        self.engine_thread.open()
        for notice in self.notices:
            self.notify(notice, severity="warning", timeout=20)
        if self.options.mcp is not None and self.options.mcp.servers:
            self.mcp = McpHub(self.options.mcp, self.options.paths.log_dir / "mcp-servers.log")
            self._mcp_worker(self.mcp)

    @work(thread=True, group="mcp", exit_on_error=False)
    def _mcp_worker(self, hub: McpHub) -> None:
        """Start the MCP servers (their own event loop thread; this worker only waits for them)."""
        try:
            errors = hub.start()
        except Exception as e:  # one line, never a traceback over the chat
            errors = [error_text(e, "starting the MCP servers")]
        self.post_message(McpReady(list(hub.tools), errors))

    def on_mcp_ready(self, message: McpReady) -> None:
        self.chat.mcp_tools = message.tools
        for error in message.errors:
            self.chat_screen.error(error)
        if message.tools:
            names = ", ".join(t.name for t in message.tools)
            self.notify(f"MCP tools the model may call (you are asked each time): {names}", timeout=8)

    def on_ready(self) -> None:
        """The chat screen is up (Textual's Ready comes after its first frame): load the pair."""
        self._start_load(pair=None)

    def get_system_commands(self, screen: Screen):
        """The command palette (Ctrl+P): the app's actions next to Textual's own."""
        yield from super().get_system_commands(screen)
        chat = self.chat_screen
        for title, help_text, action in (
            ("New chat", "Start a new conversation", chat.action_new_chat),
            ("Regenerate", "Generate the last answer again", chat.action_regenerate),
            ("Switch pair", "Load another target + draft pair", self.action_pairs),
            ("Settings", "Sampling and speculation settings", self.action_settings),
            ("Saved chats", "Resume, rename, delete or export a conversation", chat.action_history),
            ("Search chats", "Find words in every saved chat (Ctrl+F)", chat.action_search),
            ("System prompt", "Set the system prompt", chat.action_system_prompt),
            ("Copy answer", "Copy the last answer", chat.action_copy_answer),
            ("Copy code block", "Copy the last code block of the last answer", chat.action_copy_code),
            ("Attach image", "Attach an image file to your next message (Ctrl+O)", chat.action_attach_image),
            ("Paste image", "Attach the clipboard's image to your next message (Ctrl+L)", chat.action_paste_image),
            ("Draft colours", "Colour the tokens that came from the draft", chat.action_toggle_provenance),
            ("Thinking", "Fold or unfold reasoning models' thinking (F8)", chat.action_toggle_thinking),
        ):
            yield SystemCommand(title, help_text, action)

    # --- loading and pulling --------------------------------------------------------------------------------

    def _start_load(
        self, pair: str | None, *, choice: ResolvedPair | None = None, settings: ChatSettings | None = None
    ) -> None:
        """Unload the current engine (if any) and load another in a worker, with progress.

        `settings` (a drafter change) choose the drafter and apply once loaded; default the pair's own.
        """
        old = self.chat.begin_load(settings)
        self.chat_screen.draw_stats()
        self.chat_screen.set_status("loading…")
        self.chat_screen.progress(True)
        self._load_worker(old, pair, choice, settings.drafter if settings else None)

    @work(thread=True, group="load", exit_on_error=False)
    def _load_worker(self, old, pair: str | None, choice: ResolvedPair | None, drafter: str | None) -> None:
        def load() -> loading.Loaded:
            return loading.load_models(self.options, choice, drafter, self._post_progress, pair=pair)

        try:
            loaded = self.engine_thread.replace(old, load)
        except Exception as e:  # an engine bug too: one line, never a traceback over the chat
            self.post_message(LoadFailed(error_text(e, "loading")))
            return
        if loaded is not None:
            self.post_message(EngineReady(loaded))

    def _post_progress(self, text: str) -> None:
        self.post_message(LoadProgress(text))

    def on_load_progress(self, message: LoadProgress) -> None:
        self.chat_screen.set_status(message.text)

    def on_pull_bytes(self, message: PullBytes) -> None:
        self.chat_screen.progress(True, message.total, message.done)
        total = f" of {message.total / 2**20:.0f} MiB" if message.total else ""
        name = message.filename.rsplit("/", 1)[-1]  # the label may be a shortened URL
        self.chat_screen.set_status(f"downloading {name}: {message.done / 2**20:.0f} MiB{total}")

    def on_engine_ready(self, message: EngineReady) -> None:
        loaded, screen = message.loaded, self.chat_screen
        if self.engine_thread.closing:
            loaded.engine.close()
            return
        screen.progress(False)
        try:
            notices = self.chat.attach(loaded)  # on failure the pair stays loaded, so that a switch unloads it
        except LocalspecError as e:
            screen.set_status("no chat possible with this model: pick another pair (F2)")
            screen.error(str(e))
            return
        self.sub_title = terminal_safe(loaded.pair.label)
        screen.set_status(self.chat.ready_text())
        screen.draw_stats()
        if loaded.pair.defaults.notice:
            self.notify(loaded.pair.defaults.notice, severity="warning", timeout=12)
        plan = loaded.engine.plan  # a context the plan shortened is said, never silent
        for notice in (*notices, *(plan.warnings if plan is not None else ())):
            self.notify(notice, severity="warning", timeout=12)

    def on_load_failed(self, message: LoadFailed) -> None:
        screen = self.chat_screen
        fallback = None
        if message.pulled:
            self.chat.pull_ended()
        else:
            fallback = self.chat.load_failed()
        if fallback is not None:  # a switch that failed: the pair that worked comes back
            screen.error(f"{message.error}; loading {fallback.label} again")
            self._start_load(fallback.name, choice=fallback, settings=self.chat.settings)
            return
        screen.progress(False)
        ready = self.chat.session is not None
        screen.set_status(self.chat.ready_text() if ready else "no model loaded: pick a pair (F2)")
        screen.error(message.error)

    def _start_pull(self, name: str) -> None:
        self.chat.begin_pull(name)
        self.chat_screen.set_status(f"pulling {name}…")
        self.chat_screen.progress(True)
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

    def action_pairs(self) -> None:
        """Open the pair switcher."""
        if self.chat_screen.busy("switch pairs"):
            return
        if self.chat.pulling is not None:
            self.notify("a pair is being downloaded: wait for it to finish", severity="warning")
            return
        try:
            rows = loading.list_pairs(self.options)
        except LocalspecError as e:
            self.chat_screen.error(str(e))
            return
        current = self.chat.loaded.pair.name if self.chat.loaded else None
        plan = self.chat.loaded.engine.plan if self.chat.loaded else None
        placement = plan.describe() if plan is not None else ""
        self.push_screen(PairScreen(rows, current, placement), lambda name: self._pair_picked(name, rows))

    def _pair_picked(self, name: str | None, rows: list[loading.PairRow]) -> None:
        if name is None or self.chat_screen.busy("switch pairs"):
            return
        row = next(r for r in rows if r.name == name)
        if row.fix:  # a local file that is missing: nothing to download
            self.chat_screen.error(row.fix)
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
            self.chat_screen.error(str(e))
            return
        if not reload:
            self.chat_screen.draw_stats()
            self.notify("settings apply from the next message")
            return
        if self.chat_screen.busy("change the drafter"):
            return
        self._start_load(self.chat.loaded.pair.name, choice=self.chat.loaded.pair, settings=settings)

    # --- shutdown -------------------------------------------------------------------------------------------

    async def action_quit(self) -> None:
        """Quit (Ctrl+Q): an answer being generated is stopped first and saved, as Esc would."""
        self.quit_saving(0)

    def quit_saving(self, code: int) -> None:
        """Exit with `code` once the answer being generated (if any) is stopped and saved as stopped.

        A worker that does not hand the answer back within `STOP_WAIT` is not waited for any longer.
        """
        screen = self.chat_screen
        if self._quit_code is not None:  # asked twice: quit now, with what the screen shows of the answer saved
            screen.save_shown_answer()
            self.exit(return_code=code)
            return
        self._quit_code = code
        if not self.chat.stop():
            self.exit(return_code=code)
            return
        screen.set_status("stopping the answer, then quitting…")
        self.set_timer(STOP_WAIT, lambda: (screen.save_shown_answer(), self.exit(return_code=code)))

    def answer_ended(self) -> None:
        """The screen saved the answer that ended (or took back the turn that failed): a quit that waited goes on."""
        if self._quit_code is not None:
            self.exit(return_code=self._quit_code)

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
            await self.engine_thread.close(self.chat.stop, self.chat.detach)
        finally:
            self.chat.close()
            if self.mcp is not None:  # the servers' processes end with it
                await asyncio.to_thread(self.mcp.close)


def binding_groups() -> list[dict[str, str]]:
    """The chat's binding ids with their default keys, one dict per class that binds them (the keymap's ids)."""
    return bound_ids([ChatApp.BINDINGS, ChatScreen.BINDINGS, PromptInput.BINDINGS, ChatMessage.BINDINGS])


def make_app(options: ChatOptions, *, store: ChatStore | None = None, notices: tuple[str, ...] = ()) -> ChatApp:
    """Build the chat app (the CLI and the tests both come through here).

    Args:
        options: what to load and where files go (the user's keys: `chat.toml` in `options.paths.config_dir`).
        store: an open chat database; default the one at `options.db_path` or `get_paths().db_path`.
        notices: lines to show as warnings when the app is up (the CLI's notes, which the app's screen would hide).

    Raises:
        LocalspecError: the chat database cannot be opened.
    """
    store = store or ChatStore(options.db_path or get_paths().db_path)
    return ChatApp(options, store, notices, inline_images=probe_inline_images())  # asks the terminal: before it runs


__all__ = ["ChatApp", "ChatOptions", "ChatSettings", "make_app"]
