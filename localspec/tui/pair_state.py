"""The engine side of the chat, without Textual: the loaded pair, its chat session, the settings and the `Phase`.

`PairState` is the part of the `Conversation` (conversation.py, its subclass) that a load, a pair switch, a download
or the settings form change: the messages survive all of them, and a thinking choice the new model cannot follow is
said and dropped. It records what the saved conversation must know (the pair it runs on, its thinking switch)
through the conversation's store.
"""

from __future__ import annotations

import dataclasses

from localspec.core.engine import Engine
from localspec.core.params import needs_draft_model
from localspec.core.session import ChatSession
from localspec.core.stats import Stats
from localspec.core.thinking import PartStats
from localspec.core.thinking_support import ThinkingSupport, choose_thinking, thinking_choice
from localspec.errors import ContextError, InvalidParamsError, LocalspecError
from localspec.models.resolved import ResolvedPair

from .loading import Loaded
from .mcp_client import McpTool
from .settings import ChatOptions, ChatSettings
from .store import ChatStore
from .tool_calls import ToolRound
from .turn import Phase, Turn


class PairState:
    """The loaded pair, what the engine is doing, and the settings the next answer uses.

    Args:
        options: the chat's options (the chat template, the thinking flag, the defaults).
        store: the open chat database.
    """

    def __init__(self, options: ChatOptions, store: ChatStore) -> None:
        self.options = options
        self.store = store
        self.saved_id: int | None = None  # the conversation's id in the store, once its first message is saved
        self.phase = Phase.NO_MODEL
        self.pulling: str | None = None  # the pair being downloaded
        self.loaded: Loaded | None = None
        self.session: ChatSession | None = None
        self.settings = ChatSettings(max_tokens=options.max_tokens)
        self.turn: Turn | None = None
        self.tool_round: ToolRound | None = None  # an answer's tool calls being run (tool_flow.py)
        self.mcp_tools: list[McpTool] = []  # the started MCP servers' tools, offered to the model
        self.session_stats = Stats()  # every answer since the pair was loaded or the chat changed
        self.answers = 0
        self.last_turn: Stats | None = None
        self.last_parts: dict[str, PartStats] | None = None  # the last answer's thinking and answer numbers
        self.thinking = ThinkingSupport()  # what the loaded model does about thinking
        self.default_think: bool | None = None  # --think, else the pair's `thinking` (None: the model's own)
        self._pending_settings: ChatSettings | None = None  # applied when the reload they asked for is done
        self._fallback: ResolvedPair | None = None  # the pair a switch unloaded, until the new one is loaded

    def busy(self, what: str) -> str | None:
        """Why `what` cannot be done now (an answer or a load is in the way), or None."""
        if self.phase is Phase.GENERATING:
            return f"an answer is being generated: press Esc to stop it before you {what}"
        if self.phase is Phase.LOADING:
            return "the models are still loading"
        return None

    def ready_text(self) -> str:
        """The status line when nothing is under way."""
        if self.loaded is None:
            return "ready"
        pair = self.loaded.pair
        demo = (
            " (the offline demo pair: a demo of the mechanism, not a good chat model)" if pair.defaults.notice else ""
        )
        return f"ready · {pair.label}{demo}"

    def begin_load(self, settings: ChatSettings | None = None) -> Engine | None:
        """A load starts: the session goes (the messages stay); returns the old engine for the loader to close.

        Args:
            settings: settings to use once loaded (a drafter change); default the pair's own.
        """
        self._fallback = self.loaded.pair if self.loaded is not None else None  # loaded again if this load fails
        old = self.detach()
        self.phase = Phase.LOADING
        self._pending_settings = settings
        self.reset_stats()  # the numbers belong to the models that made them
        return old

    def attach(self, loaded: Loaded) -> list[str]:
        """The pair is loaded: a session continues the conversation on it.

        Returns:
            What the user must be told: a thinking choice (--think, the pair's `thinking`, the chat's) that this
            model cannot follow, which is then left to the model.

        Raises:
            LocalspecError: the target has no usable chat template (the pair stays loaded, to be unloaded).
        """
        self.loaded = loaded
        template = self.options.chat_template or loaded.pair.defaults.chat_template
        try:
            self.session = ChatSession(loaded.engine, template_name=template)
        except LocalspecError:
            self.phase = Phase.NO_MODEL
            raise
        self.phase = Phase.READY
        # the chat's own switch outlives a reload and a pair switch, when the new model has one
        kept = (self._pending_settings or self.settings).think
        self.settings = self._pending_settings or ChatSettings.initial(
            self.options, loaded.pair.defaults, loaded.drafter
        )
        self._pending_settings = None
        if self.saved_id is not None and loaded.pair.name:
            self.store.set_pair(self.saved_id, loaded.pair.name)
        return self._attach_thinking(loaded, kept)

    def _attach_thinking(self, loaded: Loaded, kept: bool | None) -> list[str]:
        """The loaded model's thinking support and the default switch; what cannot be followed is said and dropped."""
        assert self.session is not None
        self.thinking = self.session.format.thinking
        name = loaded.pair.name or loaded.pair.label
        notices = []
        flag, pair = (
            thinking_choice(self.options.think, "flag"),
            thinking_choice(loaded.pair.defaults.thinking, "pair", name),
        )
        try:
            self.default_think = choose_thinking(self.thinking, name, flag, pair)
        except LocalspecError as e:
            notices.append(f"{e} (meanwhile the model decides)")
            self.default_think = None
        if not self.thinking.can_switch:
            kept = None  # the settings say what this model does instead of offering a switch
        self.settings = dataclasses.replace(self.settings, think=kept)
        return notices

    def load_failed(self) -> ResolvedPair | None:
        """The load ended without a pair; returns the pair that was loaded before it, to load again (None: none)."""
        self.phase = Phase.NO_MODEL
        self._pending_settings = None
        fallback, self._fallback = self._fallback, None
        return fallback

    def detach(self) -> Engine | None:
        """Give up the loaded pair (to switch pairs or quit); returns its engine for the caller to close."""
        engine = self.loaded.engine if self.loaded else None
        self.loaded, self.session = None, None
        return engine

    def begin_pull(self, pair: str) -> None:
        """A download of `pair` starts (it runs alongside the chat)."""
        self.pulling = pair

    def pull_ended(self, *, pulled: bool = False) -> bool:
        """The download finished (`pulled`) or failed; returns whether to load the pulled pair now.

        It loads unless an answer or another load is under way (the user can switch to it with F2 later).
        """
        self.pulling = None
        return pulled and self.phase in (Phase.READY, Phase.NO_MODEL)

    def pick_pair(self, name: str, *, downloaded: bool) -> str:
        """What picking pair `name` in the list means: "loaded" (it already is), "load", or "pull" (offer it)."""
        if self.loaded is not None and name == self.loaded.pair.name:
            return "loaded"
        return "load" if downloaded else "pull"

    def _session(self) -> ChatSession:
        if self.session is None:
            raise ContextError("no model is loaded: pick a pair (F2)")
        return self.session

    def _end_turn(self) -> None:
        self.turn = None
        self.phase = Phase.READY if self.session is not None else Phase.NO_MODEL

    @property
    def think(self) -> bool | None:
        """The thinking switch the next answer uses: this chat's, else --think or the pair's (None: the model's)."""
        return self.settings.think if self.settings.think is not None else self.default_think

    def stop(self) -> bool:
        """Ask the answer being generated to stop; False when there is none."""
        if self.turn is None:
            if self.tool_round is None:
                return False
            self.tool_round.cancel()  # the call running ends, the rest are not run, the answer does not go on
            return True
        self.turn.cancel()
        return True

    def apply_settings(self, settings: ChatSettings) -> bool:
        """Use `settings` from the next message; True when they need a reload first (another drafter).

        Raises:
            InvalidParamsError: the drafter needs a draft model and the loaded pair has none.
        """
        if settings.think != self.settings.think and self.saved_id is not None:
            self.store.set_think(self.saved_id, settings.think)
        if self.loaded is None or settings.drafter == self.loaded.drafter:
            self.settings = settings
            return False
        if needs_draft_model(settings.drafter) and self.loaded.pair.draft is None:
            raise InvalidParamsError(
                f"the drafter {settings.drafter!r} needs a draft model and none is loaded: pick a pair "
                "(F2) or the ngram drafter"
            )
        return True

    def reset_stats(self) -> None:
        """Forget the numbers of the answers so far."""
        self.session_stats, self.answers, self.last_turn, self.last_parts = Stats(), 0, None, None
