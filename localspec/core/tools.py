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
import math
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .grammar import Grammar, GrammarError
from .schemacheck import MAX_ALTERNATIVES, problem, resolved
from .session import Message
from .toolgrammar import GEMMA_MARKERS, any_call, call_grammar, lenient, properties, string_enum, with_defs

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

    def _call_schema(self, arguments_key: str = "arguments") -> tuple[dict, dict]:
        return any_call([(f.name, f.parameters) for f in self._called()], arguments_key)

    def grammar(self) -> Grammar | None:
        """What the answer must match: the call for `required` and a named function; for `auto`, in the generic
        syntax, a call or a response, and in a model's own syntax free text until its marker and then a call (a lazy
        grammar); None (free text, parsed after) for `auto` in Llama 3.x's syntax, whose call has no marker.

        Raises:
            GrammarError: a tool's schema no grammar can follow to its end, or more tools than one choice holds.
        """
        called = self._called()
        if len(called) > MAX_ALTERNATIVES:
            raise GrammarError(
                f"{len(called)} tools are offered: a call's grammar holds {MAX_ALTERNATIVES}; offer fewer"
            )
        for f in called:
            if (why := problem(f.parameters)) is not None:
                raise GrammarError(f"the parameters schema of tool {f.name!r} {why}")
        if self.syntax == "generic":
            call, defs = self._call_schema()
            calls = {"type": "array", "items": call, "minItems": 1, **({} if self.parallel else {"maxItems": 1})}
            called = {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"]}
            called["additionalProperties"] = False
            if self.choice != "auto":
                return Grammar.json_schema(lenient(with_defs(called, defs)))
            answered = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
            answered["additionalProperties"] = False
            return Grammar.json_schema(lenient(with_defs({"anyOf": [called, answered]}, defs)))
        if self.syntax == "llama3":
            call = None if self.choice == "auto" else with_defs(*self._call_schema("parameters"))
            return None if call is None else Grammar.json_schema(lenient(call))
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
        """(the answer's content, its tool calls in OpenAI's shape) from the generated text.

        A list cut short (max_tokens) keeps its complete calls; a call identical to an earlier one ends the list (a
        model that repeats its call would go on to max_tokens: `repeats` stops it there). Under a required or named
        choice the answer was constrained to calls, so text that is no complete call is never content."""
        found, content = self._found(text)
        known = {f.name for f in self.functions}
        valid = [(name, args) for name, args in found if isinstance(name, str) and name in known]
        calls = [
            {
                "id": "call_" + uuid.uuid4().hex[:24],
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
            }
            for name, args in _until_repeat(_with_arguments(valid))
        ]
        if calls:
            return content, calls
        if self.choice != "auto":
            return None, []
        return (text if found else content), []  # a call to no known function stays the text it was

    def repeats(self, text: str) -> bool:
        """Whether the answer so far holds a call identical to an earlier one of its list (where to stop it)."""
        found = _with_arguments(self._found(text)[0])
        return len(_until_repeat(found)) < len(found)

    def _found(self, text: str) -> tuple[list[tuple[Any, Any]], str | None]:
        """The complete calls in the text, as (name, arguments) read in this syntax, and the text beside them."""
        if self.syntax == "generic":
            data = _json(text)
            if isinstance(data, dict) and isinstance(data.get("response"), str) and "tool_calls" not in data:
                return [], data["response"]  # the generic syntax's text answer
            if isinstance(data, dict) and isinstance(data.get("tool_calls"), list):
                return _named(data["tool_calls"], "arguments"), None
            return self._cut_generic(text)
        if self.syntax in ("hermes", "qwen35", "gemma4", "functiongemma"):
            return self._parse_marked(text)
        if self.syntax == "llama3":
            data = _json(text.removeprefix("<|python_tag|>"))
            if isinstance(data, dict) and "name" in data and ("parameters" in data or "arguments" in data):
                return [(data["name"], data.get("parameters", data.get("arguments")))], None
            return [], text
        at = text.find("[TOOL_CALLS]")
        head = re.match(r"\s*\[", text[at + len("[TOOL_CALLS]") :]) if at >= 0 else None
        if head is None or _only_python_json(text[at + len("[TOOL_CALLS]") :]):
            return [], text
        items = _json_items(text, at + len("[TOOL_CALLS]") + head.end())
        return _named(items, "arguments"), text[:at].strip() or None

    def _cut_generic(self, text: str) -> tuple[list[tuple[Any, Any]], str | None]:
        """An answer in the generic syntax that is not whole JSON: a list of calls or a response cut short (its
        complete calls, or the response's text so far); JSON only Python reads (NaN) stays the text it is."""
        if _only_python_json(text):
            return [], text
        if head := re.match(r'\s*\{\s*"tool_calls"\s*:\s*\[', text):
            return _named(_json_items(text, head.end()), "arguments"), None
        if head := re.match(r'\s*\{\s*"response"\s*:\s*"', text):
            return [], _cut_string(text, head.end())
        return [], text

    def _parse_marked(self, text: str) -> tuple[list[tuple[Any, Any]], str | None]:
        """The calls between the syntax's markers, and the text around them (None where there is none). A call cut
        short at the end (no closing marker, not readable) is no call and no text: after a marker, the grammar
        allows only a call."""
        open_text, close = MARKERS[self.syntax][:2]
        found, kept, pos = [], [], 0
        while (at := text.find(open_text, pos)) >= 0:
            end = text.find(close, at + len(open_text))
            call = self._read_call(text[at + len(open_text) : end if end >= 0 else len(text)])
            if call is None:
                if end < 0:
                    kept.append(text[pos:at])
                    pos = len(text)
                break
            found.append(call)
            kept.append(text[pos:at])
            pos = end + len(close) if end >= 0 else len(text)
        if not kept:
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
        keys = {key for f in self.functions for key in properties(f.parameters)}
        return _read_gemma(inner, GEMMA_MARKERS[self.syntax][2], keys)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: no JSON a client can read back
        raise ValueError(f"{text} is not a finite number")
    return value


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: Python reads them, a client's JSON parser does not


# JSON as the client reads it: NaN, Infinity and overflowing numbers make a call no call (its text stays text), so
# the arguments sent back are always JSON.
_DECODER = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)


def _json(text: str) -> Any:
    try:
        return _DECODER.decode(text.strip())
    except ValueError:
        return None


def _json_at(text: str, pos: int) -> tuple[Any, int]:
    """The JSON value starting at `pos` (whitespace skipped) and where it ends; (None, pos) when there is none."""
    start = pos
    while pos < len(text) and text[pos].isspace():
        pos += 1
    try:
        return _DECODER.raw_decode(text, pos)
    except ValueError:
        return None, start


def _only_python_json(text: str) -> bool:
    """Whether `text` is whole JSON to Python's parser, which reads NaN and Infinity, and not to a client's."""
    try:
        json.loads(text)
    except ValueError:
        return False
    return _json(text) is None


def _cut_string(text: str, pos: int) -> str | None:
    """The JSON string that opens before `pos` and is cut short, read as far as it goes (a cut escape left out)."""
    for end in range(len(text), max(pos, len(text) - 6) - 1, -1):
        try:
            return json.decoder.scanstring(text[:end] + '"', pos)[0] or None
        except ValueError:
            continue
    return None


def _json_items(text: str, pos: int) -> list[Any]:
    """The complete items of a JSON array whose `[` ends at `pos`, as far as the text goes: a list cut short keeps
    the items before the cut."""
    items = []
    while True:
        item, end = _json_at(text, pos)
        if end == pos:
            return items
        items.append(item)
        pos = end
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if not text.startswith(",", pos):
            return items
        pos += 1


def _named(calls: list[Any], arguments_key: str) -> list[tuple[Any, Any]]:
    return [(c.get("name"), c.get(arguments_key)) for c in calls if isinstance(c, dict)]


def _with_arguments(found: list[tuple[Any, Any]]) -> list[tuple[Any, dict]]:
    """The calls whose arguments are an object (none: {}; an object written as a JSON string, read), the rest left
    out: a client reads `arguments` as a JSON object."""
    out = []
    for name, args in found:
        if isinstance(args, str):
            args = _json(args)
        if args is None:
            args = {}
        if isinstance(args, dict):
            out.append((name, args))
    return out


def _until_repeat(found: list[tuple[Any, dict]]) -> list[tuple[Any, dict]]:
    """The calls up to the first one identical to an earlier one (name and arguments): a repeat ends the list."""
    seen, out = set(), []
    for name, args in found:
        key = (name, json.dumps(args, sort_keys=True))
        if key in seen:
            break
        seen.add(key)
        out.append((name, args))
    return out


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
        Message(
            *rendered_for_generic(m.role, m.content, list(m.tool_calls), m.tool_call_id),
            reasoning=m.reasoning,
            images=m.images,
        )
        for m in messages
    ]
    if out and out[0].role == "system":
        first = out[0]
        return (Message("system", f"{first.content}\n\n{tools.system_prompt()}", images=first.images), *out[1:])
    return (Message("system", tools.system_prompt()), *out)


def _read_qwen35(inner: str, parameters: dict[str, dict]) -> tuple[str, dict] | None:
    """`<function=NAME>` and its `<parameter=KEY>VALUE</parameter>`s: a value is a string where the function's schema
    says so (or it is not JSON), else the JSON it spells."""
    head = re.match(r"\s*<function=([^>\n]+)>", inner)
    if head is None or "</function>" not in inner:  # a call cut short is no call
        return None
    name = head.group(1).strip()
    root = parameters.get(name) or {}
    props = properties(resolved(root, root))
    arguments: dict[str, Any] = {}
    for hit in re.finditer(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", inner[head.end() :], re.S):
        key, value = hit.group(1).strip(), hit.group(2)
        form = resolved(props.get(key), root)
        if isinstance(form, dict) and (form.get("type") == "string" or string_enum(form)):  # written raw
            arguments[key] = value
        else:
            parsed = _json(value)
            arguments[key] = parsed if parsed is not None or value.strip() == "null" else value
    return name, arguments


def _read_gemma(inner: str, quote: str, keys: Iterable[str] = ()) -> tuple[str, Any] | None:
    """`call:NAME{key:value,…}` with strings between `quote` markers and bare keys, read as JSON (`keys`: the
    parameters' names, read whole even where one holds a `:`)."""
    head = re.match(r"\s*call:([A-Za-z0-9_.\-]+)\s*(\{.*\})\s*$", inner, re.S)
    if head is None:
        return None
    try:
        data = _json(_gemma_json(head.group(2), quote, sorted(keys, key=len, reverse=True)))
    except ValueError:
        return None
    return (head.group(1), data) if isinstance(data, dict) else None


def _gemma_json(body: str, quote: str, keys: list[str]) -> str:
    """Gemma's object text as JSON: a string between `quote` markers as a JSON string, a JSON string as it is, and a
    bare key — whatever it holds up to its `:`, since the grammar writes a parameter's name as it is — quoted.

    Raises:
        ValueError: a string or a key is not closed.
    """
    out: list[str] = []
    objects: list[bool] = []  # per open bracket: whether it is an object's (a key follows its `{` and `,`)
    pos = 0
    while pos < len(body):
        c = body[pos]
        if body.startswith(quote, pos):
            end = body.find(quote, pos + len(quote))
            if end < 0:
                raise ValueError("a string is not closed")
            out.append(json.dumps(body[pos + len(quote) : end], ensure_ascii=False))
            pos = end + len(quote)
            continue
        if c == '"':
            end = json.decoder.scanstring(body, pos + 1)[1]
            out.append(body[pos:end])
            pos = end
            continue
        out.append(c)
        pos += 1
        if c in "{[":
            objects.append(c == "{")
        elif c in "}]" and objects:
            objects.pop()
        if c in "{," and objects and objects[-1]:
            pos = _gemma_key(body, pos, quote, keys, out)
    return "".join(out)


def _gemma_key(body: str, pos: int, quote: str, keys: list[str], out: list[str]) -> int:
    """Quote the bare key at `pos` (after whitespace) into `out`; where the text after it goes on."""
    while pos < len(body) and body[pos].isspace():
        pos += 1
    if pos >= len(body) or body[pos] in '"}' or body.startswith(quote, pos):
        return pos  # a quoted key, or an empty object
    known = next((k for k in keys if body.startswith(k + ":", pos)), None)
    end = pos + len(known) if known is not None else body.find(":", pos)
    if end < 0:
        raise ValueError("a key has no value")
    out.append(json.dumps(body[pos:end].strip(), ensure_ascii=False))
    return end
