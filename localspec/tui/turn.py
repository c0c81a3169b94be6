"""One answer being generated (`Turn`), and what the engine is doing (`Phase`).

A `Turn` is made on the UI thread by the `Conversation` (a message sent, an answer generated again, a message
edited) and begun in the worker that holds the engine (`begin`); its stop works from any thread. Where the turn puts
its answer in the dialogue (`at`) lets the screen draw it there, and an edit keeps the branch it left (`before`), to
come back to if the turn cannot start.
"""

from __future__ import annotations

import enum
import math
import threading

from localspec.core.engine import Generation
from localspec.core.session import ChatSession, Message
from localspec.core.thinking import ThinkingSplit
from localspec.core.tools import ToolSetup

from . import tool_calls
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

    def begin(self) -> Generation:
        """Start the answer on the engine (in the worker thread that holds it); `split` separates its thinking.

        Raises:
            LocalspecError: e.g. the conversation does not fit the context.
        """
        settings = self.settings
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


__all__ = ["Phase", "Turn"]
