"""One answer being generated (`Turn`), and what the engine is doing (`Phase`).

A `Turn` is made on the UI thread by the `Conversation` (a message sent, an answer generated again, a message
edited) and begun in the worker that holds the engine (`begin`); its stop works from any thread. Where the turn puts
its answer in the dialogue (`at`) lets the screen draw it there, and an edit keeps the branch it left (`before`), to
come back to if the turn cannot start. Before it starts, the least of the conversation an answer needs (the system
prompt and all from the last user message on) is made to fit the context: MCP tools that leave it no room are left
out of that answer, and a tool's result too long for the room left is cut to it (`cut`, which the conversation then
keeps) — each said in one line that names what did not fit, never blamed on the user's message.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import threading
from collections.abc import Sequence

from localspec.core.engine import Generation
from localspec.core.session import ChatSession, Message
from localspec.core.thinking import ThinkingSplit
from localspec.core.tools import ToolSetup

from . import tool_calls
from .attachments import Attachment
from .live import ChunkGate, Runs
from .settings import ChatSettings


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
        tools: ToolSetup | None = None,
        calls: bool = False,
    ) -> None:
        self.id, self.kind, self.text = turn_id, kind, text
        self.tools, self.calls = tools, calls  # the MCP tools offered, and whether this answer may call them
        self.round = 0  # the rounds of tool calls this answer to the user has made so far
        self.think = think  # the thinking switch this answer is generated with (None: the model's default)
        self.message_id = message_id  # the saved user message this turn answers (kind "send")
        self.images: tuple[Attachment, ...] = ()  # that message's images (back to the prompt if the turn fails)
        self.session, self.settings, self.stop = session, settings, stop
        self.messages = messages  # the conversation it answers, as it stood when the turn started
        self.replaces_answer = False  # a regenerate that took an answer off the screen (kept in the store's tree)
        self.at = 0  # the first message of the dialogue it draws anew: its answer, or the message an edit replaced
        self.before: tuple[list[Message], list[int | None]] | None = None  # an edit's old branch (messages, ids)
        self._lock = threading.Lock()
        self._cancelled = False
        self._generation: Generation | None = None
        self.gate = ChunkGate()  # one streamed chunk in flight between the worker and the UI
        self.split: ThinkingSplit | None = None  # its thinking/answer split, once begun
        self.runs: Runs = []  # the answer so far, as the UI received it (saved as it grows)
        self.thinking_runs: Runs = []
        self.answer_id: int | None = None  # its saved row, once saved
        self.saved_at = -math.inf  # when it was last saved (time.monotonic())
        self.cut: dict[int, str] = {}  # tool results cut to the room left: their index in `messages`, the text kept

    def begin(self) -> Generation:
        """Start the answer on the engine (in the worker thread that holds it); `split` separates its thinking.

        Raises:
            LocalspecError: e.g. the conversation does not fit the context.
        """
        settings = self.settings
        notices = self._fit()
        messages, tools, grammar = tool_calls.prompt(self.session, self.messages, self.tools, self.calls)
        generation = self.session.answer(
            messages,
            tools=tools,
            grammar=grammar,
            sampling=settings.sampling,
            spec=settings.spec,
            max_tokens=settings.max_tokens,
            stop=self.stop,
            think=self.think,
        )
        generation.notices.extend(notices)
        self.split = self.session.splitter(self.think)
        with self._lock:
            self._generation = generation
            if self._cancelled:  # Esc came before the worker got here
                generation.cancel()
        return generation

    def _fit(self) -> list[str]:
        """Make the least window fit the room an answer leaves: the tools left out where they alone overflow it,
        then the results at its end cut; returns a line for each. A window that fits is one rendering."""
        window = _least_window(self.messages)
        room = self._room()
        if not window or (self.tools is None and window[-1].role != "tool") or self._n_tokens(window) <= room:
            return []
        notices = []
        bare = [dataclasses.replace(m, content="") if m.role == "tool" else m for m in window]
        if self.tools is not None and self._n_tokens(bare) > room:
            with_tools, self.tools, self.calls = self._n_tokens(bare), None, False
            if self._n_tokens(bare) > room:  # too long without the tools too: the message is, as the session says
                return []
            n_ctx, n = self.session.engine.n_ctx, with_tools - self._n_tokens(bare)
            notices.append(
                f"the MCP tools take {n:,} tokens of the {n_ctx:,}-token context: with them this message does not "
                "fit, so this answer is generated without them — raise --n-ctx, or use fewer MCP servers"
            )
        if window[-1].role == "tool" and self._n_tokens(window) > room:
            notices += self._cut_results(room)
        return notices

    def _cut_results(self, room: int) -> list[str]:
        """Cut the tool results at the end of `messages`, the longest first, each to the most text that fits."""
        notices = []
        tail = [i for i in range(_last_user(self.messages), len(self.messages)) if self.messages[i].role == "tool"]
        for i in sorted(tail, key=lambda i: -len(self.messages[i].content)):
            text = self.messages[i].content
            n_text = len(self.session.format.tokens([dataclasses.replace(self.messages[i], role="user")]))
            # no more characters than `room` tokens of the longest can hold: a result of megabytes costs no more probes
            lo, hi = 0, min(len(text), room * self.session.engine.target_model.longest_token_bytes())
            while lo < hi:  # the longest start of the result whose window fits
                mid = (lo + hi + 1) // 2
                if self._fits_with(i, _cut_text(text, mid), room):
                    lo = mid
                else:
                    hi = mid - 1
            self._set_message(i, _cut_text(text, lo))
            self.cut[i] = self.messages[i].content
            notices.append(
                f"the result of {_tool_name(self.messages, i)} (about {n_text:,} tokens) does not fit the "
                f"{self.session.engine.n_ctx:,}-token context with this chat: the model reads its first {lo:,} "
                "characters — raise --n-ctx, or ask for less"
            )
            if self._n_tokens(_least_window(self.messages)) <= room:
                break
        return notices

    def _fits_with(self, i: int, text: str, room: int) -> bool:
        messages = list(self.messages)
        messages[i] = dataclasses.replace(messages[i], content=text)
        return self._n_tokens(_least_window(messages)) <= room

    def _set_message(self, i: int, text: str) -> None:
        messages = list(self.messages)
        messages[i] = dataclasses.replace(messages[i], content=text)
        self.messages = tuple(messages)

    def _n_tokens(self, window: Sequence[Message]) -> int:
        """The tokens of `window` as this answer's prompt renders it (with its tools, if any)."""
        shown, native, _ = tool_calls.prompt(self.session, window, self.tools, False)
        return len(self.session.format.tokens(list(shown), think=self.think, tools=native))

    def _room(self) -> int:
        """The tokens a prompt may take: the context less the answer's reserve, as `ChatSession.answer` counts it."""
        n_ctx = self.session.engine.n_ctx
        return n_ctx - min(self.settings.max_tokens, n_ctx // 2)

    def cancel(self) -> None:
        """Stop after the current step (the caches stay consistent)."""
        with self._lock:
            self._cancelled = True
            if self._generation is not None:
                self._generation.cancel()


def _least_window(messages: Sequence[Message]) -> list[Message]:
    """The least of the conversation an answer needs: the system prompt, and all from the last user message on."""
    system = list(messages[:1]) if messages and messages[0].role == "system" else []
    return system + list(messages[max(_last_user(messages), len(system)) :])


def _last_user(messages: Sequence[Message]) -> int:
    return max((i for i, m in enumerate(messages) if m.role == "user"), default=0)


def _cut_text(text: str, kept: int) -> str:
    if kept >= len(text):
        return text
    note = f"[… cut to fit the context: the result was {len(text):,} characters; the first {kept:,} are kept]"
    return f"{text[:kept]}\n{note}"


def _tool_name(messages: Sequence[Message], i: int) -> str:
    """The name of the tool whose result is `messages[i]` (from the call it answers)."""
    calls = [c for m in messages[:i] for c in m.tool_calls if c.get("id") == messages[i].tool_call_id]
    return calls[-1]["function"]["name"] if calls else "a tool"


__all__ = ["Phase", "Turn"]
