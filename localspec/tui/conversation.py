"""The chat app's state without Textual: one `Conversation` owns the messages, the system prompt, the saved copy.

`Conversation.messages` is THE list of messages, written here alone, on the UI thread: a turn hands the
`ChatSession` of the loaded pair a snapshot to answer (`ChatSession.answer`), and `finish` adds the answer, so a
pair switch only swaps the session; the system prompt is its first message; the chat database is written
through as each operation happens, the answer too as it grows (`grow`, every `SAVE_EVERY` seconds), and only into
the saved conversation this window opened: one deleted in another window is saved again as a new one, and
`notices` says so. The saved messages form a tree: an edit (`edit`) or an answer generated again (`regenerate`)
starts a branch beside the old one, which stays; `switch` shows a sibling's branch. The caches keep the tokens both
branches share and re-read only what differs; the messages before the branch point stay the same objects, so the
session's window of a long chat is kept too. A user message may show images (`send`'s attachments, saved with it by
content hash, read back by `open`; the names they were attached as are message_images.py's). The engine side (the
loaded pair, the settings, the `Phase`) is `PairState`'s. `ChatApp` and its `ChatScreen` call these operations
from the UI thread and only draw the result; the one thing done off that thread is `Turn.begin`, in the worker that
holds the engine.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

from localspec.core.session import Message
from localspec.errors import ContextError, InvalidParamsError, LocalspecError

from . import tool_calls
from .attachments import Attachment
from .live import Chunk, Finished, add_run
from .message_images import ImageNames, check_images
from .pair_state import PairState
from .settings import ChatOptions
from .store import ChatStore, ConversationGone, SavedConversation, StoredMessage
from .tool_calls import Call, ToolRound
from .turn import Phase, Turn

log = logging.getLogger(__name__)

TITLE_LENGTH = 60  # characters of the first message that name a saved conversation
SAVE_EVERY = 2.0  # seconds between two saves of an answer as it grows (a crash loses at most this much of it)
INTERRUPTED = "interrupted"  # the finish reason of an answer saved while it grows, until it ends
RESAVED = "this chat was deleted in another window: it goes on as a new saved chat, with what this window shows of it"
EMPTY_EDIT = "an edited message cannot be empty: type its new text (Esc keeps the old one)"


class Conversation(PairState):
    """The conversation on screen, its saved copy, the loaded pair and what the engine is doing.

    Args:
        options: the chat's options (the first system prompt, the chat template, stop strings, defaults).
        store: the open chat database (closed by `close`).
    """

    def __init__(self, options: ChatOptions, store: ChatStore) -> None:
        super().__init__(options, store)
        system = options.system or ""
        self.messages: list[Message] = [Message("system", system)] if system.strip() else []
        self.ids: list[int | None] = []  # the saved ids of `dialogue`, in order (None: not saved)
        self.saved_created: str | None = None  # and its creation time: another chat that took a freed id is not it
        self.notices: list[str] = []  # what the user must be told since `take_notices` was last called
        self.turn_ids = 0  # turns started so far (their ids)
        self.image_names = ImageNames()  # the file name each image on screen was attached as

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

    def saved_messages(self) -> list[StoredMessage] | None:
        """The saved copy of the branch on screen (with provenance and stats; a round of tool calls expanded into
        its results), or None before the first is saved."""
        return tool_calls.expand(self.store.messages(self.saved_id)) if self.saved_id is not None else None

    def index(self, message_id: int) -> int:
        """Where saved message `message_id` is in `dialogue`.

        Raises:
            ContextError: it is not on screen (any more).
        """
        if message_id not in self.ids:
            raise ContextError("that message is no longer in this chat")
        return self.ids.index(message_id)

    def _truncate(self, at: int) -> None:
        """Take the dialogue's messages from `at` on off the screen (they stay in the store's tree)."""
        del self.messages[self._n_system + at :]
        del self.ids[at:]

    def _tip(self) -> int | None:
        """The saved message the next one follows: the last saved one on screen (None: it starts the chat)."""
        return next((i for i in reversed(self.ids) if i is not None), None)

    # --- turns -----------------------------------------------------------------------------------------------

    def send(self, text: str, images: Sequence[Attachment] = ()) -> Turn:
        """Add the user's message (its images before its text), saved before it is answered; returns the turn for a
        worker to `begin`.

        Raises:
            ContextError: no model is loaded.
            InvalidParamsError: it has images and the pair reads none (then nothing is saved).
            LocalspecError: the message cannot be saved (then it is not added).
        """
        session = self._session()
        if images:
            check_images(self.loaded)
        message_id = self._save({"role": "user", "content": text, "images": list(images)})  # committed first
        self.messages.append(self.image_names.user_message(text, images))
        self.ids.append(message_id)
        turn = self._start("send", session, text, message_id)
        turn.images = tuple(images)
        return turn

    def attachments(self, message: Message) -> list[Attachment]:
        """A message's images with the names they were attached as."""
        return self.image_names.attachments(message)

    def edit(self, message_id: int, text: str) -> Turn:
        """Replace user message `message_id` by `text` as a new branch from there (the old one stays, a sibling) and
        answer it; returns the turn. The messages before it stay as they are, so the caches keep them.

        Raises:
            InvalidParamsError: `text` is empty.
            ContextError: no model is loaded, or the message is not the user's or not on screen.
            LocalspecError: the edit cannot be saved (then nothing changes).
        """
        session = self._session()
        text = text.rstrip()
        if not text.strip():
            raise InvalidParamsError(EMPTY_EDIT)
        at = self.index(message_id)
        if self.dialogue[at].role != "user":
            raise ContextError("only your own messages can be edited: generate an answer again instead")
        images = self.attachments(self.dialogue[at])  # the edit shows the same pictures (stored once, shared)
        before = (list(self.messages), list(self.ids))
        self._truncate(at)
        try:
            new_id = self._save({"role": "user", "content": text, "images": images})
        except LocalspecError:
            self.messages[:], self.ids[:] = before
            raise
        self.messages.append(self.image_names.user_message(text, images))
        self.ids.append(new_id)
        turn = self._start("edit", session, text, new_id)
        turn.at, turn.before = at, before
        return turn

    def _save(self, message: dict) -> int:
        """Append `message` (`ChatStore.add_message`'s arguments) after the last saved message on screen, in the
        saved conversation this window opened, or save the conversation on screen with it when there is none (the
        first message, or a chat another window deleted: then `notices` says so); returns its id.

        Raises:
            LocalspecError: it cannot be saved (then nothing of it is).
        """
        if self.saved_id is not None:
            try:
                return self.store.add_message(
                    self.saved_id, **message, parent_id=self._tip(), created=self.saved_created
                )
            except ConversationGone:
                log.warning("saved conversation %d was deleted elsewhere: saving it again", self.saved_id)
                self.saved_id = None
                self.notices.append(RESAVED)
        shown = [
            {"role": m.role, "content": m.content, "reasoning": m.reasoning, "images": self.attachments(m)}
            for m in self.dialogue
        ]
        users = [m for m in (*shown, message) if m["role"] == "user"]
        first = next((m["content"] for m in users if m["content"].strip()), "")
        if not first:  # a chat opened by a picture alone is named after it
            first = next((a.name for m in users for a in m.get("images") or ()), message["content"])
        pair = (self.loaded.pair.name or self.loaded.pair.label) if self.loaded else ""
        self.saved_id, self.saved_created, ids = self.store.save_copy(
            " ".join(first.split())[:TITLE_LENGTH],
            [*shown, message],
            pair=pair,
            system=self.system,
            think=self.settings.think,
        )
        self.ids = ids[:-1]
        return ids[-1]

    def take_notices(self) -> list[str]:
        """What the user must be told since the last call (a chat saved again, …); the list is emptied."""
        notices, self.notices = self.notices, []
        return notices

    def regenerate(self, message_id: int | None = None) -> Turn:
        """Answer again: answer `message_id` (default the last answer, or the last question when it has none) is
        taken off the screen — kept in the store's tree, a sibling of the new one — with what followed it.

        Raises:
            ContextError: no model is loaded, there is nothing to regenerate, or that message is not an answer.
        """
        session = self._session()
        if not self.dialogue:
            raise ContextError("nothing to regenerate: send a message first")
        at = len(self.dialogue) - 1 if message_id is None else self.index(message_id)
        if self.dialogue[at].role in ("user", "tool"):
            if message_id is not None:
                raise ContextError("that is your message: edit it (e) to answer it differently")
            at += 1  # the last message is a question without an answer
        replaces = at < len(self.dialogue)
        self._truncate(at)
        if replaces and self.saved_id is not None:
            try:  # the saved branch ends at the question until the new answer is saved
                self.store.set_leaf(self.saved_id, self._tip())
            except LocalspecError as e:
                log.warning("the saved chat still shows the old answer: %s", e)
        after_tool = bool(self.dialogue) and self.dialogue[-1].role == "tool"  # an answer to a tool's result
        turn = self._start("regenerate", session, rounds=1 if after_tool else 0)
        turn.replaces_answer, turn.at = replaces, at
        return turn

    def _start(self, kind: str, session, text: str = "", message_id: int | None = None, rounds: int = 0) -> Turn:
        self.turn_ids += 1
        tools, mcp = None, self.options.mcp
        if self.mcp_tools and mcp is not None:
            tools = tool_calls.tool_setup(self.mcp_tools, session, mcp.tool_choice if rounds == 0 else "auto")
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
            tools=tools,
            calls=tools is not None and mcp is not None and rounds < mcp.max_rounds,
        )
        self.turn.round = rounds
        self.turn.at = len(self.dialogue)
        self.phase = Phase.GENERATING
        return self.turn

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
        if turn is not None and turn.cut:
            self._keep_cut(turn)
        content, calls = finished.text, []
        if turn is not None and turn.tools is not None and turn.calls and finished.reason == "stop":
            parsed, found = turn.tools.parse(finished.text)  # the generic syntax's answer is its "response"
            content, calls = parsed or "", tool_calls.calls_of(found)
        answer = {
            "role": "assistant",
            "content": content,
            "finish_reason": finished.reason,
            "stats": stats,
            "provenance": finished.runs,
            "reasoning": finished.reasoning,
            "reasoning_provenance": finished.reasoning_runs or None,
            "tool_calls": [c.saved() for c in calls] or None,
        }
        try:
            if self.saved_id is not None:  # saved before the answer is on screen: a copy saved anew holds it once
                self._save_answer(turn, answer)
        finally:
            openai = tuple(c.openai() for c in calls)
            self.messages.append(Message("assistant", content, finished.reasoning, tool_calls=openai))
            self.ids.append(turn.answer_id if turn is not None else None)
            if calls and turn is not None:  # the calls run next, one by one, as the user allows (tool_flow.py)
                self.tool_round = ToolRound(turn.answer_id, calls, turn.round + 1)
                self.phase = Phase.GENERATING

    def _keep_cut(self, turn: Turn) -> None:
        """The results `turn` cut to fit the context replace the whole ones, in the dialogue and saved: the next
        answer reads what this one read (the caches keep it), and so does the chat resumed."""
        for i, text in turn.cut.items():
            shown = self.messages[i] if i < len(self.messages) else None
            if shown is None or shown.role != "tool" or shown.tool_call_id != turn.messages[i].tool_call_id:
                continue  # the dialogue changed since the turn began: nothing of it to replace
            self.messages[i] = dataclasses.replace(shown, content=text)
            answer_id = self.ids[i - self._n_system]
            if self.saved_id is not None and answer_id is not None:
                self._save_result(answer_id, shown.tool_call_id, text)

    def _save_result(self, answer_id: int, call_id: str, text: str) -> None:
        """Rewrite the saved result of call `call_id` of answer `answer_id` (a failure is logged)."""
        try:
            saved = next((m for m in self.store.messages(self.saved_id) if m.id == answer_id), None)
            calls = [{**c, "result": text} if c.get("id") == call_id else c for c in (saved and saved.tool_calls) or []]
            if calls:
                self.store.set_tool_calls(self.saved_id, answer_id, calls)
        except LocalspecError as e:
            log.warning("the cut result could not be saved (the whole one stays saved): %s", e)

    def tool_result(self, call: Call, status: str, text: str) -> None:
        """The current call of the round ended (ran, declined, stopped): its result joins the dialogue and the saved
        answer. A save that fails is logged: the result is on screen and goes to the model all the same."""
        tool_round = self.tool_round
        assert tool_round is not None and tool_round.next_call() is call
        call.status, call.result = status, text
        tool_round.at += 1
        self.messages.append(Message("tool", text, tool_call_id=call.id))
        self.ids.append(tool_round.message_id)
        if self.saved_id is not None and tool_round.message_id is not None:
            try:
                self.store.set_tool_calls(self.saved_id, tool_round.message_id, [c.saved() for c in tool_round.calls])
            except LocalspecError as e:
                log.warning("the tool's result could not be saved: %s", e)

    def continue_tools(self) -> Turn | None:
        """Every call of the round has its result: the answer goes on (a new turn), unless the user stopped it."""
        tool_round, self.tool_round = self.tool_round, None
        if tool_round is None or tool_round.cancelled or self.session is None:
            self._end_turn()
            return None
        return self._start("tool", self.session, rounds=tool_round.round)

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
        """The turn could not start: a message sent by it is taken back, here and from the store; an edit's old
        branch comes back."""
        self._end_turn()
        if turn.kind not in ("send", "edit"):
            return
        if turn.before is not None:
            self.messages[:], self.ids[:] = turn.before
        elif self.messages and self.messages[-1].role == "user":
            self.messages.pop()
            self.ids.pop()
        if self.saved_id is not None and turn.message_id is not None:
            try:
                self.store.delete_message(self.saved_id, turn.message_id)
                if turn.before is not None:
                    self.store.set_leaf(self.saved_id, self._tip())
                elif not self.store.get(self.saved_id).n_messages:
                    # Its title came from the message just taken back: a conversation of nothing is not kept.
                    self.store.delete(self.saved_id)
                    self.saved_id = self.saved_created = None
            except LocalspecError as e:  # the database is locked: the message stays saved, the text comes back
                log.warning("the message that was not answered stays saved: %s", e)

    # --- the conversation as a whole -------------------------------------------------------------------------

    def new(self) -> None:
        """Start a new conversation (the system prompt stays)."""
        del self.messages[self._n_system :]
        self.ids.clear()
        if self.session is not None:
            self.session.clear()  # forgets the window it kept of the old conversation
        self.saved_id = self.saved_created = None
        self.settings = dataclasses.replace(self.settings, think=None)  # a new chat starts at the default switch
        self.reset_stats()

    def forget(self, saved_id: int) -> None:
        """The saved conversation `saved_id` was deleted: if it is this one, it is no longer saved."""
        if saved_id == self.saved_id:
            self.saved_id = self.saved_created = None
            self.ids = [None] * len(self.ids)

    def open(self, saved_id: int, at: int | None = None) -> tuple[SavedConversation, list[StoredMessage]]:
        """Continue a saved conversation (its system prompt comes with it); returns it and its branch on screen.

        Args:
            at: a message to show: its branch is shown when it is not on the one shown last (a search hit).

        Raises:
            ContextError: no model is loaded.
            LocalspecError: it cannot be read (e.g. it was deleted).
        """
        if self.session is None:
            raise ContextError("no model is loaded: pick a pair (F2) first")
        saved = self.store.get(saved_id)
        stored = self.store.messages(saved_id)
        if at is not None and at not in [m.id for m in stored]:
            self.store.show(saved_id, at)
            stored = self.store.messages(saved_id)
        stored = tool_calls.expand(stored)
        system = [Message("system", saved.system)] if saved.system.strip() else []
        self.messages[:] = system + [self._restored(m) for m in stored]
        self.ids = [m.id for m in stored]
        self.saved_id, self.saved_created = saved_id, saved.created
        think = saved.think if self.thinking.can_switch else None  # its own switch, where this model has one
        self.settings = dataclasses.replace(self.settings, think=think)
        self.reset_stats()
        return saved, stored

    def switch(self, message_id: int, step: int) -> tuple[int, list[StoredMessage]] | None:
        """Show the branch of the sibling `step` places from message `message_id` (-1: the one before); returns
        where the dialogue changed and the branch now on screen, or None when there is no sibling that way.

        Raises:
            ContextError: the message is not on screen.
            LocalspecError: the database cannot be written.
        """
        self.index(message_id)
        if self.saved_id is None or not self.store.switch(self.saved_id, message_id, step):
            return None
        stored = tool_calls.expand(self.store.messages(self.saved_id))
        same = 0  # the messages before the branch point stay the same objects (the session's window keeps them)
        while same < min(len(stored), len(self.ids)) and stored[same].id == self.ids[same]:
            same += 1
        self._truncate(same)
        self.messages += [self._restored(m) for m in stored[same:]]
        self.ids += [m.id for m in stored[same:]]
        return same, stored

    def _restored(self, m: StoredMessage) -> Message:
        """A saved (expanded) message as the session reads it, its images read back from the store."""
        message = tool_calls.as_message(m)
        return self.image_names.restored(message, self.store.attachments(m)) if m.images else message

    def set_system(self, text: str) -> None:
        """Set (or with "" remove) the system prompt of this conversation and the next ones.

        Raises:
            LocalspecError: the saved conversation cannot be updated.
        """
        text = text.strip()
        self.messages[:] = ([Message("system", text)] if text else []) + self.dialogue
        if self.saved_id is not None:
            self.store.set_system(self.saved_id, text)

    def close(self) -> None:
        """Close the chat database (the engine is the caller's: see `detach`)."""
        self.store.close()


__all__ = ["Conversation", "Phase", "Turn"]
