"""Tool calls (issue 46): the tools a request offers (or the chat, from its MCP servers), in the model's own
tool-call syntax, constrained where they must be called and parsed back into OpenAI's `tool_calls`.

The syntax is the template's (`detect_syntax`, as llama.cpp's common/chat does): Hermes/Qwen (`<tool_call>{…}
</tool_call>`), Llama 3.x (a bare `{"name", "parameters"}` object), Mistral (`[TOOL_CALLS][…]`), and for a template
that cannot render tools, a generic JSON answer taught in a system message — `{"tool_calls": [{"name",
"arguments"}]}` or `{"response": "…"}` — as llama.cpp's generic handler does. With `tool_choice` `required` or a
named function the answer is grammar-constrained to the call (each function's `parameters` schema), so even a small
model writes a valid one; `auto` is constrained the same way in the generic syntax (a call or a response), and in a
model's own syntax left free and parsed.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .grammar import Grammar
from .session import Message

SYNTAXES = ("hermes", "llama3", "mistral", "generic")


def detect_syntax(template: str | None, reads: frozenset[str]) -> str:
    """The tool-call syntax a chat template teaches its model (`reads`: the variables it reads)."""
    text = template or ""
    if "tools" not in reads:
        return "generic"
    if "<tool_call>" in text:
        return "hermes"
    if "[TOOL_CALLS]" in text:
        return "mistral"
    if "<|python_tag|>" in text or '"parameters"' in text or "ipython" in text:
        return "llama3"
    return "hermes"  # a template that renders tools and names no syntax: Qwen's and NousResearch's is the commonest


@dataclass(frozen=True, slots=True)
class Function:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolSetup:
    """A request's tools as the run uses them: the syntax, the functions, the choice."""

    syntax: str
    functions: tuple[Function, ...]
    choice: str  # "auto", "required", or a function's name
    parallel: bool = True

    def openai_tools(self) -> list[dict]:
        """The tools as a template's `tools` variable reads them (OpenAI's shape)."""
        return [
            {"type": "function", "function": {"name": f.name, "description": f.description, "parameters": f.parameters}}
            for f in self.functions
        ]

    def system_prompt(self) -> str:
        """The generic syntax, taught in a system message to a template that cannot render tools."""
        tools = json.dumps(self.openai_tools(), ensure_ascii=False)
        if self.choice == "auto":
            how = (
                'To call tools, answer with JSON only: {"tool_calls": [{"name": <function name>, "arguments": '
                '<arguments object>}]}. To answer without a tool, answer with JSON only: {"response": <your answer>}.'
            )
        else:
            how = 'Answer with JSON only: {"tool_calls": [{"name": <function name>, "arguments": <arguments object>}]}.'
        return f"You can call these tools:\n{tools}\n{how}"

    def _called(self) -> list[Function]:
        if self.choice in ("auto", "required"):
            return list(self.functions)
        return [f for f in self.functions if f.name == self.choice]

    def _call_schema(self, arguments_key: str = "arguments") -> dict:
        options = [
            {
                "type": "object",
                "properties": {"name": {"const": f.name}, arguments_key: _closed(f.parameters)},
                "required": ["name", arguments_key],
                "additionalProperties": False,
            }
            for f in self._called()
        ]
        return options[0] if len(options) == 1 else {"anyOf": options}

    def grammar(self) -> Grammar | None:
        """What the answer must match: the call for `required` and a named function; for `auto`, in the generic
        syntax, a call or a response; None (free text, parsed after) for `auto` in a model's own syntax."""
        calls = {"type": "array", "items": self._call_schema(), "minItems": 1}
        if not self.parallel:
            calls["maxItems"] = 1
        if self.syntax == "generic":
            called = {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"]}
            called["additionalProperties"] = False
            if self.choice != "auto":
                return Grammar.json_schema(called)
            answered = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
            answered["additionalProperties"] = False
            return Grammar.json_schema({"anyOf": [called, answered]})
        if self.choice == "auto":
            return None
        if self.syntax == "hermes":
            call = json.dumps(self._call_schema())
            repeat = "+" if self.parallel else ""
            lark = f'start: call{repeat}\ncall: "<tool_call>\\n" body "\\n</tool_call>\\n"?\nbody: %json {call}\n'
            return Grammar("lark", lark)
        if self.syntax == "llama3":
            return Grammar.json_schema(self._call_schema("parameters"))
        return Grammar("lark", f'start: "[TOOL_CALLS]" body\nbody: %json {json.dumps(calls)}\n')

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """(the answer's content, its tool calls in OpenAI's shape) from the generated text."""
        found: list[tuple[str, Any]] = []
        content: str | None = text
        if self.syntax == "generic":
            data = _json(text)
            if isinstance(data, dict) and isinstance(data.get("tool_calls"), list):
                found = [(c.get("name"), c.get("arguments")) for c in data["tool_calls"] if isinstance(c, dict)]
                content = None
            elif isinstance(data, dict) and isinstance(data.get("response"), str):
                return data["response"], []  # the generic syntax's text answer
        elif self.syntax == "hermes":
            kept, pos = [], 0
            for hit in re.finditer(r"<tool_call>", text):
                if hit.start() < pos:
                    continue
                data, end = _json_at(text, hit.end())
                if not isinstance(data, dict):
                    continue
                found.append((data.get("name"), data.get("arguments", data.get("parameters"))))
                kept.append(text[pos : hit.start()])
                close = text.find("</tool_call>", end)
                pos = close + len("</tool_call>") if close >= 0 else end
            if found:
                content = ("".join(kept) + text[pos:]).strip() or None
        elif self.syntax == "llama3":
            data = _json(text.removeprefix("<|python_tag|>"))
            if isinstance(data, dict) and "name" in data and ("parameters" in data or "arguments" in data):
                found, content = [(data["name"], data.get("parameters", data.get("arguments")))], None
        else:
            at = text.find("[TOOL_CALLS]")
            data = _json(text[at + len("[TOOL_CALLS]") :]) if at >= 0 else None
            if isinstance(data, list):
                found = [(c.get("name"), c.get("arguments")) for c in data if isinstance(c, dict)]
                content = text[:at].strip() or None
        known = {f.name for f in self.functions}
        calls = [
            {
                "id": "call_" + uuid.uuid4().hex[:24],
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args if args is not None else {})},
            }
            for name, args in found
            if name in known
        ]
        return (content if calls else text), calls


def _closed(parameters: dict[str, Any]) -> dict[str, Any]:
    """A function's parameters as its call is constrained: only the parameters it declares (`additionalProperties`
    false where the schema does not say, as OpenAI's strict function calling has it) — a small model constrained to
    an open object goes on inventing keys."""
    if not parameters:
        return {"type": "object"}
    if "properties" in parameters and "additionalProperties" not in parameters:
        return {**parameters, "additionalProperties": False}
    return parameters


def _json(text: str) -> Any:
    try:
        return json.loads(text.strip())
    except ValueError:
        return None


def _json_at(text: str, pos: int) -> tuple[Any, int]:
    """The JSON value starting at `pos` (whitespace skipped) and where it ends; (None, pos) when there is none."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    try:
        return json.JSONDecoder().raw_decode(text, pos)
    except ValueError:
        return None, pos


def rendered_for_generic(role: str, content: str, tool_calls: list[dict], tool_call_id: str) -> tuple[str, str]:
    """A round trip's message as a template without tools renders it: an assistant's calls as the generic JSON it
    wrote, a tool's result as a user message that says which call it answers."""
    if role == "assistant" and tool_calls:
        calls = [
            {"name": c["function"]["name"], "arguments": _json(c["function"]["arguments"]) or {}} for c in tool_calls
        ]
        return "assistant", json.dumps({"tool_calls": calls}, ensure_ascii=False)
    if role == "tool":
        return "user", json.dumps({"tool_response": {"tool_call_id": tool_call_id, "content": content}})
    return role, content


def with_tools(messages: Sequence[Message], tools: ToolSetup) -> tuple[Message, ...]:
    """The conversation as the template renders it with tools: as it is where the template renders tools itself;
    for the generic syntax, the tools taught in the system message and the round trip's calls and results written
    as the JSON the model is taught."""
    if tools.syntax != "generic":
        return tuple(messages)
    out = [
        Message(*rendered_for_generic(m.role, m.content, list(m.tool_calls), m.tool_call_id), reasoning=m.reasoning)
        for m in messages
    ]
    if out and out[0].role == "system":
        return (Message("system", f"{out[0].content}\n\n{tools.system_prompt()}"), *out[1:])
    return (Message("system", tools.system_prompt()), *out)
