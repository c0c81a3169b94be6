"""The grammars of tool calls (issue 46), one per tool-call syntax, in llguidance's Lark: a call to one of the
functions, its arguments constrained to the function's `parameters` schema.

`required` (or a named function): the answer is one call or more, from the syntax's opening marker on. `auto`: a
lazy grammar — free text until the syntax's marker, then the call (the trigger of llama.cpp's lazy grammars, written
as one grammar: a text terminal that cannot hold the marker, and one that ends at its first occurrence). A marker
the vocabulary holds as one special token is named by its id (`<[id]>`), so the model's own marker token is what
matches, never its text spelled in pieces.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from localspec.core.grammar import Grammar
from localspec.core.schemacheck import DATA_KEYWORDS, closed, local_ref, resolved

QWEN35_STRING_END = "\n</parameter>"


def lark_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def lark_regex(text: str) -> str:
    """`text` as a literal inside a Lark regex `/…/`."""
    return "".join(c if c.isalnum() or c in " <>=:_,'" else "\\n" if c == "\n" else "\\" + c for c in text)


def marker(text: str, specials: dict[str, int]) -> str:
    """A marker as the grammar matches it: the vocabulary's special token by id, else the text."""
    return f"<[{specials[text]}]>" if text in specials else lark_string(text)


def lazy(open_text: str, rest: str, specials: dict[str, int], free_specials: Sequence[int] = ()) -> str:
    """`start:` free text, or free text up to the first `open_text` and then `rest` (a rule's right-hand side). Free
    text may hold `free_specials` (token ids: a thinking model's `<think>`), which no text terminal matches."""
    other = token_set(free_specials)
    if open_text in specials:  # a special token: no text ever matches it
        words = f"(TEXT | {other})+" if other else "TEXT"
        return f"start: free? | free? {marker(open_text, specials)} {rest}\nfree: {words}\nTEXT: /(?s:.+)/\n"
    m = lark_regex(open_text)
    pre = f"(TEXT? {other})* " if other else ""
    return (
        f"start: {pre}TEXT? | {pre}LEAD {rest}\n"
        f"TEXT: /(?s:.+)/ & ~/(?s:.*{m}.*)/\n"  # text that holds no marker: an answer in words
        f"LEAD: /(?s:.*{m})/ & ~/(?s:.*{m}.+)/\n"  # text up to the first marker, the marker included
    )


def token_set(ids: Sequence[int]) -> str:
    """Token ids as one llguidance token set, `<[3-16,40]>` ("" for none)."""
    spans: list[list[int]] = []
    for i in sorted(set(ids)):
        if spans and spans[-1][1] == i - 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return "<[" + ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans) + "]>" if spans else ""


def lenient(schema: dict[str, Any]) -> dict[str, Any]:
    """A tool's schema as its call is constrained: a keyword the grammar library does not implement is left out of the
    constraint instead of refusing the request (Claude Code's tools use `propertyNames`; every request that offered
    them was a 400). The call is still parsed, and the client checks it against its own schema. A `response_format`
    schema stays strict: there an unimplemented keyword is a 400 naming it."""
    return {**schema, "x-guidance": {**schema.get("x-guidance", {}), "lenient": True}}


def _has_local_ref(schema: object) -> bool:
    if isinstance(schema, dict):
        if local_ref(schema.get("$ref")):
            return True
        return any(_has_local_ref(v) for k, v in schema.items() if k not in DATA_KEYWORDS)
    return isinstance(schema, list) and any(_has_local_ref(v) for v in schema)


def refs_under(schema: Any, base: str) -> Any:
    """`schema` with each local `$ref` (`#`, `#/…`) pointing under `base` (a JSON pointer): the schema as it reads
    once placed at `base` inside a larger one."""
    if isinstance(schema, list):
        return [refs_under(v, base) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: v if k in DATA_KEYWORDS else refs_under(v, base) for k, v in schema.items()}
    if local_ref(ref := schema.get("$ref")):
        out["$ref"] = "#" + base + ref[1:]
    return out


def placed(index: int, parameters: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A function's (closed) parameters as they sit inside a larger schema, and the `$defs` that schema's root must
    hold. A tool's `#/$defs/X` (pydantic's, the MCP SDK's, `openai.pydantic_function_tool`'s) points into the tool's
    own schema, not the grammar's: where it has local refs, the schema goes under the root's `$defs` (as
    `fn{index}`) with its refs pointing there, and the call refers to it. A schema without refs is left as it is."""
    schema = closed(parameters)
    if not _has_local_ref(schema):
        return schema, {}
    key = f"fn{index}"
    return {"$ref": f"#/$defs/{key}"}, {key: refs_under(schema, f"/$defs/{key}")}


def with_defs(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "$defs": defs} if defs else schema


def in_order(items: list[tuple[str, bool]], separator: str, prefix: str) -> tuple[list[str], str]:
    """The items (each a rule's name, required or not) in their order, separated by `separator` (a Lark expression,
    or "" for none), each optional one possibly left out: (the rules, the expression that matches the list)."""
    n = len(items)
    sep = f"{separator} " if separator else ""

    def ref(kind: str, i: int) -> str:
        return "" if i == n else f"{prefix}_{kind}_{i}"

    rules = []
    for i in range(n - 1, -1, -1):
        item, required = items[i]
        after, first = ref("after", i + 1), ref("first", i + 1)
        rules.append(f"{prefix}_after_{i}: " + (f"{sep}{item} {after}" if required else f"({sep}{item})? {after}"))
        if required:
            rules.append(f"{prefix}_first_{i}: {item} {after}")
        else:
            rules.append(f"{prefix}_first_{i}: {item} {after} | {first}" if first else f"{prefix}_first_{i}: {item}?")
    return rules, ref("first", 0)


def properties(parameters: dict[str, Any]) -> dict[str, Any]:
    """A parameters schema's `properties` ({} where it is not an object of names)."""
    props = parameters.get("properties") if isinstance(parameters, dict) else None
    return props if isinstance(props, dict) else {}


def string_enum(schema: object) -> bool:
    """A parameter whose values are a list of strings (written as literal alternatives, not as JSON)."""
    return isinstance(schema, dict) and "enum" in schema and all(isinstance(e, str) for e in schema["enum"])


def _json_value(schema: object, defs: dict[str, Any]) -> str:
    """A parameter's value as JSON under its (lenient) schema, as a Lark rule (`defs`: what its refs point into)."""
    return f"%json {json.dumps(lenient(with_defs(schema if isinstance(schema, dict) else {}, defs)))}"


def _parameters(index: int, parameters: dict[str, Any]) -> tuple[dict, set, Callable[[Any], tuple[Any, str]]]:
    """A function's properties, its required names, and each property's (schema followed through a top-level
    `$ref`, its value as JSON)."""
    body = resolved(parameters, parameters)
    _, defs = placed(index, parameters)

    def value(schema: Any) -> tuple[Any, str]:
        own = refs_under(schema, f"/$defs/fn{index}") if defs else schema
        return resolved(schema, parameters), _json_value(own, defs)

    return properties(body), set(body.get("required") or ()), value


def qwen35_function(index: int, name: str, parameters: dict[str, Any]) -> list[str]:
    """Qwen3.5's (and Qwen3-Coder's) XML call of one function: `<function=NAME>`, then each parameter as
    `<parameter=KEY>\\nVALUE\\n</parameter>\\n`, a string written raw, any other value as JSON."""
    props, required, value_of = _parameters(index, parameters)
    items, rules = [], []
    for j, (key, schema) in enumerate(props.items()):
        head = lark_string(f"<parameter={key}>\n")
        form, as_json = value_of(schema)
        if isinstance(form, dict) and form.get("type") == "string" and "enum" not in form:
            value = "QWEN35_STRING"  # raw text up to the first "\n</parameter>", that included
        elif string_enum(form):
            value = "(" + " | ".join(lark_string(e + QWEN35_STRING_END) for e in form["enum"]) + ")"
        else:
            value = f"{as_json} {lark_string(QWEN35_STRING_END)}"
        rules.append(f"q{index}_p{j}: {head} {value} {lark_string(chr(10))}")
        items.append((f"q{index}_p{j}", key in required))
    listed, args = in_order(items, "", f"q{index}")
    rules += listed
    rules.append(f"q{index}: {lark_string(f'<function={name}>' + chr(10))} {args} {lark_string('</function>')}")
    return rules


def gemma_function(index: int, name: str, parameters: dict[str, Any], quote: str, specials: dict[str, int]) -> list:
    """Gemma's call of one function: `call:NAME{key:value,…}`, a string value between quote markers (`<|"|>` for
    Gemma 4, `<escape>` for FunctionGemma), any other value as JSON (the parser reads both)."""
    props, required, value_of = _parameters(index, parameters)
    q = marker(quote, specials)
    text = "GEMMA_TEXT" if quote in specials else "GEMMA_STRING"
    items, rules = [], []
    for j, (key, schema) in enumerate(props.items()):
        form, as_json = value_of(schema)
        if string_enum(form):
            value = "(" + " | ".join(f"{q} {lark_string(e)} {q}" for e in form["enum"]) + ")"
        elif isinstance(form, dict) and form.get("type") == "string":
            value = f"{q} {text}? {q}" if text == "GEMMA_TEXT" else f"{q} {text}"
        else:
            value = as_json
        rules.append(f"g{index}_p{j}: {lark_string(key + ':')} {value}")
        items.append((f"g{index}_p{j}", key in required))
    listed, args = in_order(items, '","', f"g{index}")
    rules += listed
    rules.append(f"g{index}: {lark_string(f'call:{name}' + '{')} {args} {lark_string('}')}")
    return rules


def gemma_terminals(quote: str, specials: dict[str, int]) -> str:
    if quote in specials:
        return "GEMMA_TEXT: /(?s:.+)/\n"
    m = lark_regex(quote)
    return f"GEMMA_STRING: /(?s:.*{m})/ & ~/(?s:.*{m}.+)/\n"  # the string's text and its closing quote


def call_grammar(
    syntax: str, functions: list[tuple[str, dict]], parallel: bool, lazy_start: bool, specials, free_specials=()
) -> Grammar:
    """The Lark grammar of a call (one or more where `parallel`) in `syntax` (hermes, qwen35, mistral, gemma4,
    functiongemma), from the marker on; with `lazy_start`, free text before it (`tool_choice: auto`)."""
    if syntax in ("hermes", "qwen35"):
        open_text, close = "<tool_call>", "</tool_call>"
        if syntax == "hermes":
            rules = [f"body: %json {json.dumps(lenient(with_defs(*any_call(functions))))}"]
            one = f'"\\n" body "\\n" {marker(close, specials)}'
        else:
            rules = [r for i, (n, p) in enumerate(functions) for r in qwen35_function(i, n, closed(p))]
            rules.append("body: " + " | ".join(f"q{i}" for i in range(len(functions))))
            rules.append(f"QWEN35_STRING: /(?s:.*{lark_regex(QWEN35_STRING_END)})/ & ~/(?s:.*\\n<\\/parameter>.+)/")
            one = f'"\\n" body "\\n" {marker(close, specials)}'
        more = f'("\\n"? {marker(open_text, specials)} {one})*' if parallel else ""
        rest = f'{one} {more} "\\n"?'
    elif syntax == "mistral":
        open_text = "[TOOL_CALLS]"
        call, defs = any_call(functions)
        calls = {"type": "array", "items": call, "minItems": 1, **({} if parallel else {"maxItems": 1})}
        rules, rest = [], f"%json {json.dumps(lenient(with_defs(calls, defs)))}"
    elif syntax in ("gemma4", "functiongemma"):
        open_text, close, quote = GEMMA_MARKERS[syntax]
        rules = [r for i, (n, p) in enumerate(functions) for r in gemma_function(i, n, closed(p), quote, specials)]
        rules.append("body: " + " | ".join(f"g{i}" for i in range(len(functions))))
        rules.append(gemma_terminals(quote, specials).strip())
        one = f"body {marker(close, specials)}"
        more = f"({marker(open_text, specials)} {one})*" if parallel else ""
        rest = f"{one} {more}"
    else:
        raise ValueError(f"no call grammar for the {syntax} syntax")
    head = (
        lazy(open_text, rest, specials, free_specials)
        if lazy_start
        else f"start: {marker(open_text, specials)} {rest}\n"
    )
    return Grammar("lark", head + "\n".join(rules) + "\n")


GEMMA_MARKERS = {
    "gemma4": ("<|tool_call>", "<tool_call|>", '<|"|>'),
    "functiongemma": ("<start_function_call>", "<end_function_call>", "<escape>"),
}


def any_call(functions: list[tuple[str, dict]], arguments_key: str = "arguments") -> tuple[dict, dict]:
    """The schema of one call of any of the functions, and the `$defs` its root must hold (`placed`)."""
    options, defs = [], {}
    for i, (name, parameters) in enumerate(functions):
        arguments, own = placed(i, parameters)
        defs |= own
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": name}, arguments_key: arguments},
                "required": ["name", arguments_key],
                "additionalProperties": False,
            }
        )
    return (options[0] if len(options) == 1 else {"anyOf": options}), defs
