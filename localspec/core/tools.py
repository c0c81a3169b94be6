"""Tool calls (issue 46): the tools a request offers (or the chat, from its MCP servers), in the model's own
tool-call syntax, constrained where they must be called and parsed back into OpenAI's `tool_calls`.

The syntax is the template's (`detect_syntax`, as llama.cpp's common/chat does): Hermes/Qwen (`<tool_call>{…}
</tool_call>`), Qwen3.5's XML (`<tool_call><function=NAME><parameter=KEY>…`, Qwen3-Coder's too), Llama 3.x (a bare
`{"name", "parameters"}` object), Mistral (`[TOOL_CALLS][…]`), Gemma 4's (`<|tool_call>call:NAME{key:<|"|>…<|"|>}
<tool_call|>`) and FunctionGemma's (the same with `<start_function_call>` and `<escape>`), and for a template that
cannot render tools, a generic JSON answer taught in a system message — `{"tool_calls": [{"name", "arguments"}]}` or
`{"response": "…"}` — as llama.cpp's generic handler does. With `tool_choice` `required` or a named function the
answer is grammar-constrained to the call (each function's `parameters` schema, core/toolgrammar.py), so even a
small model writes a valid one; `auto` is a lazy grammar: free text until the syntax's marker, then the call.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .grammar import Grammar
from .session import Message
from .toolgrammar import GEMMA_MARKERS, call_grammar, closed, lenient

SYNTAXES = ("hermes", "qwen35", "llama3", "mistral", "gemma4", "functiongemma", "generic")
# The text that opens a call, per syntax: a vocabulary's special token for it is found by this text (`markers`).
MARKERS = {
    "hermes": ("<tool_call>", "</tool_call>"),
    "qwen35": ("<tool_call>", "</tool_call>"),
    "llama3": ("<|python_tag|>",),
    "mistral": ("[TOOL_CALLS]",),
    **GEMMA_MARKERS,
}


def detect_syntax(template: str | None, reads: frozenset[str]) -> str:
    """The tool-call syntax a chat template teaches its model (`reads`: the variables it reads)."""
    text = template or ""
    if "tools" not in reads:
        return "generic"
    if "<function=" in text and "<parameter=" in text:
        return "qwen35"  # Qwen3.5's and Qwen3-Coder's XML calls, inside <tool_call>
    if "<tool_call>" in text:
        return "hermes"
    if "<|tool_call>" in text:
        return "gemma4"
    if "<start_function_call>" in text:
        return "functiongemma"
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
    specials: dict[str, int] = field(default_factory=dict)  # MARKERS the vocabulary holds as one special token
    free_specials: tuple[int, ...] = ()  # the other special tokens free text may hold (`auto`: `</think>`)

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
                "properties": {"name": {"const": f.name}, arguments_key: closed(f.parameters)},
                "required": ["name", arguments_key],
                "additionalProperties": False,
            }
            for f in self._called()
        ]
        return options[0] if len(options) == 1 else {"anyOf": options}

    def grammar(self) -> Grammar | None:
        """What the answer must match: the call for `required` and a named function; for `auto`, in the generic
        syntax, a call or a response, and in a model's own syntax free text until its marker and then a call (a lazy
        grammar); None (free text, parsed after) for `auto` in Llama 3.x's syntax, whose call has no marker."""
        calls = {"type": "array", "items": self._call_schema(), "minItems": 1}
        if not self.parallel:
            calls["maxItems"] = 1
        if self.syntax == "generic":
            called = {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"]}
            called["additionalProperties"] = False
            if self.choice != "auto":
                return Grammar.json_schema(lenient(called))
            answered = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
            answered["additionalProperties"] = False
            return Grammar.json_schema(lenient({"anyOf": [called, answered]}))
        if self.syntax == "llama3":
            return None if self.choice == "auto" else Grammar.json_schema(lenient(self._call_schema("parameters")))
        functions = [(f.name, f.parameters) for f in self._called()]
        return call_grammar(
            self.syntax, functions, self.parallel, self.choice == "auto", self.specials, self.free_specials
        )

    def marked_text(self, tokens: Sequence[int], token_bytes: Callable[[int], bytes]) -> str | None:
        """The answer's text with each marker token written out, where a marker is a control token that renders as
        nothing (Mistral's `[TOOL_CALLS]`, Gemma 4's `<|tool_call>`); None where every marker renders itself."""
        by_id = {i: t.encode() for t, i in self.specials.items() if not token_bytes(i)}
        if not by_id:
            return None
        return b"".join(by_id.get(t) or token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

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
        elif self.syntax in ("hermes", "qwen35", "gemma4", "functiongemma"):
            found, content = self._parse_marked(text)
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

    def _parse_marked(self, text: str) -> tuple[list[tuple[Any, Any]], str | None]:
        """The calls between the syntax's markers, and the text around them (None where there is none)."""
        open_text, close = MARKERS[self.syntax][:2]
        found, kept, pos = [], [], 0
        while (at := text.find(open_text, pos)) >= 0:
            end = text.find(close, at + len(open_text))
            inner = text[at + len(open_text) : end if end >= 0 else len(text)]
            call = self._read_call(inner)
            if call is None:
                break
            found.append(call)
            kept.append(text[pos:at])
            pos = end + len(close) if end >= 0 else len(text)
        if not found:
            return [], text
        return found, ("".join(kept) + text[pos:]).strip() or None

    def _read_call(self, inner: str) -> tuple[Any, Any] | None:
        """(name, arguments) of one call's text between the markers, in this syntax; None if it is not a call."""
        if self.syntax == "hermes":
            data, _ = _json_at(inner, 0)
            ok = isinstance(data, dict)
            return (data.get("name"), data.get("arguments", data.get("parameters"))) if ok else None
        if self.syntax == "qwen35":
            return _read_qwen35(inner, {f.name: f.parameters for f in self.functions})
        return _read_gemma(inner, GEMMA_MARKERS[self.syntax][2])


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


def _read_qwen35(inner: str, parameters: dict[str, dict]) -> tuple[str, dict] | None:
    """`<function=NAME>` and its `<parameter=KEY>VALUE</parameter>`s: a value is a string where the function's schema
    says so (or it is not JSON), else the JSON it spells."""
    head = re.match(r"\s*<function=([^>\n]+)>", inner)
    if head is None:
        return None
    name = head.group(1).strip()
    props = (parameters.get(name) or {}).get("properties") or {}
    arguments: dict[str, Any] = {}
    for hit in re.finditer(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", inner[head.end() :], re.S):
        key, value = hit.group(1).strip(), hit.group(2)
        if (props.get(key) or {}).get("type") == "string":
            arguments[key] = value
        else:
            parsed = _json(value)
            arguments[key] = parsed if parsed is not None or value.strip() == "null" else value
    return name, arguments


def _read_gemma(inner: str, quote: str) -> tuple[str, Any] | None:
    """`call:NAME{key:value,…}` with strings between `quote` markers and bare keys, read as JSON."""
    head = re.match(r"\s*call:([A-Za-z0-9_.\-]+)\s*(\{.*\})\s*$", inner, re.S)
    if head is None:
        return None
    out, pos, body = [], 0, head.group(2)
    while (at := body.find(quote, pos)) >= 0:  # each quoted string becomes a JSON string
        end = body.find(quote, at + len(quote))
        if end < 0:
            return None
        out += [_bare_keys(body[pos:at]), json.dumps(body[at + len(quote) : end], ensure_ascii=False)]
        pos = end + len(quote)
    out.append(_bare_keys(body[pos:]))
    data = _json("".join(out))
    return (head.group(1), data) if isinstance(data, dict) else None


def _bare_keys(text: str) -> str:
    """Gemma's bare object keys quoted (`{city:` → `{"city":`), in text outside its strings."""
    return re.sub(r"([{,]\s*)([A-Za-z_][A-Za-z0-9_.\-]*)(\s*:)", r'\1"\2"\3', text)
