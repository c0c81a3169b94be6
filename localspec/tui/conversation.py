"""The chat app's state without Textual: one `Conversation` owns the messages, the system prompt, the saved copy.

`Conversation.messages` is THE list of messages, written here alone, on the UI thread: a turn hands the
`ChatSession` of the loaded pair a snapshot to answer (`ChatSession.answer`), and `finish` adds the answer, so a
pair switch only swaps the session; the system prompt is its first message; the chat database is written
through as each operation happens, the answer too as it grows (`grow`, every `SAVE_EVERY` seconds), and only into
the saved conversation this window opened: one deleted in another window is saved again as a new one, and
`notices` says so. `Phase` says what the engine is doing. `ChatApp` and its `ChatScreen` call these operations
from the UI thread and only draw the result; the one thing done off that thread is `Turn.begin`, in the worker that
holds the engine.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import threading
import time

from localspec.core.engine import Engine, Generation
from localspec.core.params import needs_draft_model
from localspec.core.session import ChatSession, Message
from localspec.core.stats import Stats
from localspec.core.thinking import PartStats, ThinkingSplit
from localspec.core.thinking_support import ThinkingSupport, choose_thinking, thinking_choice
from localspec.errors import ContextError, InvalidParamsError, LocalspecError
from localspec.models.resolved import ResolvedPair

from .live import Chunk, ChunkGate, Finished, Runs, add_run
from .loading import Loaded
from .settings import ChatOptions, ChatSettings
from .store import ChatStore, ConversationGone, SavedConversation, StoredMessage

log = logging.getLogger(__name__)

TITLE_LENGTH = 60  # characters of the first message that name a saved conversation
SAVE_EVERY = 2.0  # seconds between two saves of an answer as it grows (a crash loses at most this much of it)
INTERRUPTED = "interrupted"  # the finish reason of an answer saved while it grows, until it ends
RESAVED = "this chat was deleted in another window: it goes on as a new saved chat, with what this window shows of it"


class Phase(enum.Enum):
    """What the engine is doing (a download is separate: `Conversation.pulling`, it runs alongside a chat)."""

    NO_MODEL = "no model"  # nothing loaded, a load failed, or the model cannot chat
    LOADING = "loading"
    READY = "ready"
    GENERATING = "generating"


class Turn:
    """One answer being generated: what started it, and a stop that works from any thread."""

    def __init__(
        self,
        turn_id: int,
        kind: str,
        session: ChatSession,
        messages: tuple[Message, ...],
        settings: ChatSettings,
        stop: tuple[str, ...] = (),
        text: str = "",
        message_id: int | None = None,
        think: bool | None = None,
    ) -> None:
        self.id, self.kind, self.text = turn_id, kind, text
        self.think = think  # the thinking switch this answer is generated with (None: the model's default)
        self.message_id = message_id  # the saved user message this turn answers (kind "send")
        self.session, self.settings, self.stop = session, settings, stop
        self.messages = messages  # the conversation it answers, as it stood when the turn started
        self.replaces_answer = False  # a regenerate that dropped the last answer (its widget goes too)
        self._lock = threading.Lock()
        self._cancelled = False
        self._generation: Generation | None = None
        self.gate = ChunkGate()  # one streamed chunk in flight between the worker and the UI
        self.split: ThinkingSplit | None = None  # its thinking/answer split, once begun
        self.runs: Runs = []  # the answer so far, as the UI received it (saved as it grows)
        self.thinking_runs: Runs = []
        self.answer_id: int | None = None  # its saved row, once saved
        self.saved_at = -math.inf  # when it was last saved (time.monotonic())

    def begin(self) -> Generation:
        """Start the answer on the engine (in the worker thread that holds it); `split` separates its thinking.

        Raises:
            LocalspecError: e.g. the conversation does not fit the context.
        """
        settings = self.settings
        generation = self.session.answer(
            self.messages,
            sampling=settings.sampling,
            spec=settings.spec,
            max_tokens=settings.max_tokens,
            stop=self.stop,
            think=self.think,
        )
        self.split = self.session.splitter(self.think)
        with self._lock:
            self._generation = generation
            if self._cancelled:  # Esc came before the worker got here
                generation.cancel()
        return generation

    def cancel(self) -> None:
        """Stop after the current step (the caches stay consistent)."""
        with self._lock:
            self._cancelled = True
            if self._generation is not None:
                self._generation.cancel()


class Conversation:
    """The conversation on screen, its saved copy, the loaded pair and what the engine is doing.

    Args:
        options: the chat's options (the first system prompt, the chat template, stop strings, defaults).
        store: the open chat database (closed by `close`).
    """

    def __init__(self, options: ChatOptions, store: ChatStore) -> None:
        self.options = options
        self.store = store
        system = options.system or ""
        self.messages: list[Message] = [Message("system", system)] if system.strip() else []
        self.saved_id: int | None = None  # the conversation's id in the store, once its first message is saved
        self.saved_created: str | None = None  # and its creation time: another chat that took a freed id is not it
        self.notices: list[str] = []  # what the user must be told since `take_notices` was last called
        self.phase = Phase.NO_MODEL
        self.pulling: str | None = None  # the pair being downloaded
        self.loaded: Loaded | None = None
        self.session: ChatSession | None = None
        self.settings = ChatSettings(max_tokens=options.max_tokens)
        self.turn: Turn | None = None
        self.turn_ids = 0  # turns started so far (their ids)
        self.session_stats = Stats()  # every answer since the pair was loaded or the chat changed
        self.answers = 0
        self.last_turn: Stats | None = None
        self.last_parts: dict[str, PartStats] | None = None  # the last answer's thinking and answer numbers
        self.thinking = ThinkingSupport()  # what the loaded model does about thinking
        self.default_think: bool | None = None  # --think, else the pair's `thinking` (None: the model's own)
        self._pending_settings: ChatSettings | None = None  # applied when the reload they asked for is done
        self._fallback: ResolvedPair | None = None  # the pair a switch unloaded, until the new one is loaded

    # --- what is there ---------------------------------------------------------------------------------------

    @property
    def system(self) -> str:
        """The system prompt ("" for none): the first message when it is a system message."""
        return self.messages[0].content if self._n_system else ""

    @property
    def dialogue(self) -> list[Message]:
        """The messages after the system prompt."""
        return self.messages[self._n_system :]

    @property
    def _n_system(self) -> int:
        return 1 if self.messages and self.messages[0].role == "system" else 0

    def busy(self, what: str) -> str | None:
        """Why `what` cannot be done now (an answer or a load is in the way), or None."""
        if self.phase is Phase.GENERATING:
            return f"an answer is being generated: press Esc to stop it before you {what}"
        if self.phase is Phase.LOADING:
            return "the models are still loading"
        return None

    def saved_messages(self) -> list[StoredMessage] | None:
        """The saved copy of the messages (with provenance and stats), or None before the first is saved."""
        return self.store.messages(self.saved_id) if self.saved_id is not None else None

    # --- loading and pulling ---------------------------------------------------------------------------------

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

    # --- turns -----------------------------------------------------------------------------------------------

    def send(self, text: str) -> Turn:
        """Add the user's message, saved before it is answered; returns the turn for a worker to `begin`.

        Raises:
            ContextError: no model is loaded.
            LocalspecError: the message cannot be saved (then it is not added).
        """
        session = self._session()
        message_id = self._save({"role": "user", "content": text})  # committed before generating
        self.messages.append(Message("user", text))
        return self._start("send", session, text, message_id)

    def _save(self, message: dict) -> int:
        """Append `message` (`ChatStore.add_message`'s arguments) to the saved conversation this window opened, or
        save the conversation on screen with it when there is none (the first message, or a chat another window
        deleted: then `notices` says so); returns its id.

        Raises:
            LocalspecError: it cannot be saved (then nothing of it is).
        """
        if self.saved_id is not None:
            try:
                return self.store.add_message(self.saved_id, **message, created=self.saved_created)
            except ConversationGone:
                log.warning("saved conversation %d was deleted elsewhere: saving it again", self.saved_id)
                self.saved_id = None
                self.notices.append(RESAVED)
        shown = [{"role": m.role, "content": m.content, "reasoning": m.reasoning} for m in self.dialogue]
        first = next((m["content"] for m in (*shown, message) if m["role"] == "user"), message["content"])
        pair = (self.loaded.pair.name or self.loaded.pair.label) if self.loaded else ""
        self.saved_id, self.saved_created, ids = self.store.save_copy(
            " ".join(first.split())[:TITLE_LENGTH],
            [*shown, message],
            pair=pair,
            system=self.system,
            think=self.settings.think,
        )
        return ids[-1]

    def take_notices(self) -> list[str]:
        """What the user must be told since the last call (a chat saved again, …); the list is emptied."""
        notices, self.notices = self.notices, []
        return notices

    def regenerate(self) -> Turn:
        """Drop the last answer (here and saved) and answer the last user message again.

        Raises:
            ContextError: no model is loaded, or there is nothing to regenerate.
        """
        session = self._session()
        if not self.dialogue:
            raise ContextError("nothing to regenerate: send a message first")
        replaces = self.messages[-1].role == "assistant"
        if replaces:
            self.messages.pop()
        if self.saved_id is not None:
            self.store.delete_last_answer(self.saved_id)
        turn = self._start("regenerate", session)
        turn.replaces_answer = replaces
        return turn

    def _session(self) -> ChatSession:
        if self.session is None:
            raise ContextError("no model is loaded: pick a pair (F2)")
        return self.session

    def _start(self, kind: str, session: ChatSession, text: str = "", message_id: int | None = None) -> Turn:
        self.turn_ids += 1
        self.turn = Turn(
            self.turn_ids,
            kind,
            session,
            tuple(self.messages),
            self.settings,
            self.options.stop,
            text,
            message_id,
            think=self.think,
        )
        self.phase = Phase.GENERATING
        return self.turn

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
            return False
        self.turn.cancel()
        return True

    def finish(self, finished: Finished) -> None:
        """The answer ended (stopped or cut short too): add it to the conversation, count its stats and save it.

        Raises:
            LocalspecError: the answer cannot be saved (it stays in the conversation).
        """
        turn = self.turn
        self._end_turn()
        self.session_stats.merge(finished.stats)
        self.answers += 1
        self.last_turn = finished.stats
        self.last_parts = finished.parts
        stats = finished.stats.to_dict()
        if finished.parts is not None:
            stats["parts"] = {name: part.to_dict() for name, part in finished.parts.items()}
        answer = {
            "role": "assistant",
            "content": finished.text,
            "finish_reason": finished.reason,
            "stats": stats,
            "provenance": finished.runs,
            "reasoning": finished.reasoning,
            "reasoning_provenance": finished.reasoning_runs or None,
        }
        try:
            if self.saved_id is not None:  # saved before the answer is on screen: a copy saved anew holds it once
                self._save_answer(turn, answer)
        finally:
            self.messages.append(Message("assistant", finished.text, finished.reasoning))

    def grow(self, chunk: Chunk, now: float | None = None) -> None:
        """The answer being generated grew by `chunk`: saved (as "interrupted") at the first chunk and then every
        `SAVE_EVERY` seconds, so that a crash, a kill or a power cut keeps all but its last seconds. A save that
        fails is logged and tried again at the next; `finish` saves the whole answer and says what fails then."""
        turn = self.turn
        if turn is None:
            return
        for text, from_draft in chunk.runs:
            add_run(turn.runs, text, from_draft)
        for text, from_draft in chunk.thinking_runs:
            add_run(turn.thinking_runs, text, from_draft)
        now = time.monotonic() if now is None else now
        if self.saved_id is None or now - turn.saved_at < SAVE_EVERY:
            return
        turn.saved_at = now
        answer = {
            "role": "assistant",
            "content": "".join(text for text, _ in turn.runs),
            "finish_reason": INTERRUPTED,
            "provenance": list(turn.runs),
            "reasoning": "".join(text for text, _ in turn.thinking_runs).strip(),
            "reasoning_provenance": list(turn.thinking_runs) or None,
        }
        try:
            self._save_answer(turn, answer)
        except LocalspecError as e:
            log.warning("the answer so far could not be saved: %s", e)

    def _save_answer(self, turn: Turn | None, answer: dict) -> None:
        """Save the answer of `turn`: its row rewritten when it was saved as it grew, else appended."""
        if turn is not None and turn.answer_id is not None and self.saved_id is not None:
            fields = {k: v for k, v in answer.items() if k not in ("role", "content")}
            try:
                self.store.update_message(self.saved_id, turn.answer_id, answer["content"], **fields)
                return
            except ConversationGone:
                turn.answer_id = None
        answer_id = self._save(answer)
        if turn is not None:
            turn.answer_id = answer_id

    def fail(self, turn: Turn) -> None:
        """The turn could not start: a message sent by it is taken back, here and from the store."""
        self._end_turn()
        if turn.kind != "send":
            return
        if self.messages and self.messages[-1].role == "user":
            self.messages.pop()
        if self.saved_id is not None and turn.message_id is not None:
            try:
                self.store.delete_message(self.saved_id, turn.message_id)
                if not self.store.messages(self.saved_id):
                    # Its title came from the message just taken back: a conversation of nothing is not kept.
                    self.store.delete(self.saved_id)
                    self.saved_id = self.saved_created = None
            except LocalspecError as e:  # the database is locked: the message stays saved, the text comes back
                log.warning("the message that was not answered stays saved: %s", e)

    # --- the conversation as a whole -------------------------------------------------------------------------

    def new(self) -> None:
        """Start a new conversation (the system prompt stays)."""
        del self.messages[self._n_system :]
        if self.session is not None:
            self.session.clear()  # forgets the window it kept of the old conversation
        self.saved_id = self.saved_created = None
        self.settings = dataclasses.replace(self.settings, think=None)  # a new chat starts at the default switch
        self.reset_stats()

    def forget(self, saved_id: int) -> None:
        """The saved conversation `saved_id` was deleted: if it is this one, it is no longer saved."""
        if saved_id == self.saved_id:
            self.saved_id = self.saved_created = None

    def open(self, saved_id: int) -> tuple[SavedConversation, list[StoredMessage]]:
        """Continue a saved conversation (its system prompt comes with it); returns it and its messages.

        Raises:
            ContextError: no model is loaded.
            LocalspecError: it cannot be read (e.g. it was deleted).
        """
        if self.session is None:
            raise ContextError("no model is loaded: pick a pair (F2) first")
        saved = self.store.get(saved_id)
        stored = self.store.messages(saved_id)
        system = [Message("system", saved.system)] if saved.system.strip() else []
        self.messages[:] = system + [Message(m.role, m.content, m.reasoning) for m in stored]
        self.saved_id, self.saved_created = saved_id, saved.created
        think = saved.think if self.thinking.can_switch else None  # its own switch, where this model has one
        self.settings = dataclasses.replace(self.settings, think=think)
        self.reset_stats()
        return saved, stored

    def set_system(self, text: str) -> None:
        """Set (or with "" remove) the system prompt of this conversation and the next ones.

        Raises:
            LocalspecError: the saved conversation cannot be updated.
        """
        text = text.strip()
        self.messages[:] = ([Message("system", text)] if text else []) + self.dialogue
        if self.saved_id is not None:
            self.store.set_system(self.saved_id, text)

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

    def close(self) -> None:
        """Close the chat database (the engine is the caller's: see `detach`)."""
        self.store.close()


__all__ = ["Conversation", "Phase", "Turn"]
