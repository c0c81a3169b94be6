"""The chat's tool calls without Textual: what a round of calls is, how it is saved, and how it is rendered.

An answer that calls tools is saved as one row of the chat's tree with its calls and, as they come, their results
(`tool_calls`, a JSON column): every branch operation treats the round as one answer. On screen and to the model it
is the answer (`Message.tool_calls`, OpenAI's shape) followed by one "tool" message per call (`expand`). The syntax,
the rendering, the grammar and the parsing are the server's (core/tools.py): the chat offers its MCP tools as a
request offers its functions.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from localspec.core.grammar import Grammar
from localspec.core.session import ChatSession, Message
from localspec.core.tools import Function, ToolSetup, detect_syntax, rendered_for_generic, with_tools

from .mcp_client import McpTool
from .store import StoredMessage

# What a call's result says when it has none: the model reads it like any result.
DECLINED = "the user declined this tool call"
STOPPED = "the user stopped the answer before this call ran"
NO_RESULT = "no result: the chat ended before this call ran"


@dataclass(slots=True)
class Call:
    """One tool call of an answer: its id, the tool's name as the model wrote it, the arguments (JSON text), and
    once run its status ("pending", "ok", "error", "timeout", "declined", "stopped") and result."""

    id: str
    name: str
    arguments: str
    status: str = "pending"
    result: str = ""

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def saved(self) -> dict:
        return {k: getattr(self, k) for k in ("id", "name", "arguments", "status", "result")}

    def parsed_arguments(self) -> dict:
        try:
            value = json.loads(self.arguments or "{}")
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def title(self) -> str:
        """The call as one line: `name {"arg": …}`."""
        return f"{self.name} {self.arguments}"


@dataclass(slots=True)
class ToolRound:
    """The calls of one answer, run one after the other on the UI thread's say-so (`next_call`)."""

    message_id: int | None  # the saved answer that made them
    calls: list[Call]
    round: int  # 1 for the first round of calls of an answer to the user
    at: int = 0  # the next call to run
    cancelled: bool = False
    on_cancel: list = field(default_factory=list)  # what the screen undoes when the user stops (an open question)

    def next_call(self) -> Call | None:
        return self.calls[self.at] if self.at < len(self.calls) else None

    def cancel(self) -> None:
        self.cancelled = True
        for undo in self.on_cancel:
            undo()


def calls_of(parsed: list[dict]) -> list[Call]:
    """The calls `ToolSetup.parse` found, as the chat keeps them."""
    return [Call(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in parsed]


def expand(stored: Sequence[StoredMessage]) -> list[StoredMessage]:
    """The branch as the dialogue holds it: after an answer with tool calls, one "tool" message per call (its
    result, under the answer's id)."""
    out: list[StoredMessage] = []
    for m in stored:
        out.append(m)
        for call in m.tool_calls or []:
            text = call.get("result") or (NO_RESULT if call.get("status") == "pending" else "")
            out.append(dataclasses.replace(m, role="tool", content=text, provenance=None, tool_calls=[call]))
    return out


def as_message(m: StoredMessage) -> Message:
    """A saved (expanded) message as the session reads it."""
    if m.role == "tool":
        return Message("tool", m.content, tool_call_id=(m.tool_calls or [{}])[0].get("id", ""))
    calls = tuple(Call(c["id"], c["name"], c["arguments"]).openai() for c in m.tool_calls or [])
    return Message(m.role, m.content, m.reasoning, tool_calls=calls)


def tool_setup(tools: Sequence[McpTool], session: ChatSession, choice: str = "auto") -> ToolSetup:
    """The MCP tools in the loaded model's tool-call syntax."""
    fmt = session.format
    functions = tuple(Function(t.name, t.description, t.parameters) for t in tools)
    # one call per answer: a small model let free to call again and again repeats itself; the answer goes on after
    # each call, so more calls are more rounds
    return ToolSetup(detect_syntax(fmt.template, fmt.reads), functions, choice, parallel=False)


def prompt(
    session: ChatSession, messages: Sequence[Message], tools: ToolSetup | None, calls: bool
) -> tuple[tuple[Message, ...], list[dict] | None, Grammar | None]:
    """(the messages as the template renders them, its `tools` variable, the grammar) for one answer.

    The tools are rendered the same way on every round (with the `auto` wording), so the caches keep the whole
    conversation from one round to the next; `calls` False (the last round) drops the grammar and the parsing
    only. A conversation with tool messages and no tools offered (no server this time) is still rendered.
    """
    if tools is None:
        if not any(m.role == "tool" or m.tool_calls for m in messages):
            return tuple(messages), None, None
        fmt = session.format
        if detect_syntax(fmt.template, fmt.reads) != "generic":
            return tuple(messages), None, None
        generic = [rendered_for_generic(m.role, m.content, list(m.tool_calls), m.tool_call_id) for m in messages]
        return tuple(Message(role, text) for role, text in generic), None, None
    shown = dataclasses.replace(tools, choice="auto")
    native = shown.openai_tools() if shown.syntax != "generic" else None
    return with_tools(messages, shown), native, tools.grammar() if calls else None
