"""Tool-call syntaxes (core/tools.py, issue 46): told from the template, written as each family writes them,
constrained where a call is required, parsed back; and the round trip rendered by Qwen3's real template."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, Field
from support.tinymodels import qwen3_template

from localspec.core.grammar import Grammar, GrammarError, GrammarVocab
from localspec.core.session import ChatFormat, Message
from localspec.core.tools import Function, ToolSetup, detect_syntax
from localspec.llama.model import Model
from localspec.llama.templates import template_variables
from localspec.llama.vocab import grammar_pieces, grammar_tokenizer
from localspec.server.request import special_markers

WEATHER = Function(
    "get_weather",
    "The weather",
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]},
)
LLAMA3 = (
    '{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}Use JSON {"name": "f", "parameters": {}}'
    "{% endif %}<|python_tag|>"
)
MISTRAL = "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]"
QWEN35 = (
    "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}<tools>{{ tools | tojson }}</tools>"
    "<tool_call>\n<function=example>\n<parameter=x>\nvalue\n</parameter>\n</function>\n</tool_call>{% endif %}"
)
GEMMA4 = "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}<|tool>{% endif %}<|tool_call>call:"
FUNCTIONGEMMA = "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}<start_function_call>{% endif %}"
CALLS = {  # one call of get_weather(city="Paris") as each syntax writes it
    "hermes": '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>\n',
    "qwen35": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "llama3": '{"name":"get_weather","parameters":{"city":"Paris"}}',
    "mistral": '[TOOL_CALLS][{"name":"get_weather","arguments":{"city":"Paris"}}]',
    "gemma4": '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
    "functiongemma": "<start_function_call>call:get_weather{city:<escape>Paris<escape>}<end_function_call>",
    "generic": '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}',
}


@pytest.mark.parametrize(
    "template,syntax",
    [
        (qwen3_template(), "hermes"),
        (QWEN35, "qwen35"),
        (LLAMA3, "llama3"),
        (MISTRAL, "mistral"),
        (GEMMA4, "gemma4"),
        (FUNCTIONGEMMA, "functiongemma"),
        ("{{ messages }}", "generic"),
    ],
)
def test_the_syntax_is_told_from_the_template(template, syntax):
    assert detect_syntax(template, template_variables(template)) == syntax


@pytest.mark.parametrize(
    "syntax,text",
    [
        ("hermes", 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
        ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'),
        ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
        ("qwen35", "Sure.\n" + CALLS["qwen35"]),
        ("gemma4", "Sure." + CALLS["gemma4"]),
        ("functiongemma", "Sure." + CALLS["functiongemma"]),
        ("generic", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'),
    ],
)
def test_each_syntax_is_parsed_into_openai_tool_calls(syntax, text):
    content, calls = ToolSetup(syntax, (WEATHER,), "auto").parse(text)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    assert content == ("Sure." if syntax in ("hermes", "qwen35", "gemma4", "functiongemma") else None)


def test_text_without_a_call_is_content_and_an_unknown_function_is_not_a_call():
    setup = ToolSetup("hermes", (WEATHER,), "auto")
    assert setup.parse("Just text.") == ("Just text.", [])
    assert setup.parse('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>')[1] == []
    assert ToolSetup("generic", (WEATHER,), "auto").parse('{"response": "Hi"}') == ("Hi", [])


def test_values_are_read_as_each_syntax_types_them():
    """Qwen3.5 writes a string raw and any other value as JSON; Gemma quotes strings with its marker and leaves keys
    bare; both the same arguments as JSON."""
    f = Function("f", "", {"type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "integer"}}})
    qwen = "<tool_call>\n<function=f>\n<parameter=s>\n12 <b>\n</parameter>\n<parameter=n>\n12\n</parameter>\n"
    qwen += "</function>\n</tool_call>"
    gemma = '<|tool_call>call:f{s:<|"|>12, {a:b}<|"|>,n:12,xs:[1,2],o:{k:<|"|>v<|"|>}}<tool_call|>'
    assert json.loads(ToolSetup("qwen35", (f,), "auto").parse(qwen)[1][0]["function"]["arguments"]) == {
        "s": "12 <b>",
        "n": 12,
    }
    assert json.loads(ToolSetup("gemma4", (f,), "auto").parse(gemma)[1][0]["function"]["arguments"]) == {
        "s": "12, {a:b}",
        "n": 12,
        "xs": [1, 2],
        "o": {"k": "v"},
    }


@pytest.fixture(scope="module")
def smol(smollm2_path):
    model = Model(smollm2_path, vocab_only=True)
    yield model, GrammarVocab(grammar_pieces(model), sorted(model.eog_tokens()), grammar_tokenizer(model))
    model.close()


def walk(vocab, setup, model, text):
    """Push `text`'s tokens through the setup's grammar: (all allowed, accepting at the end)."""
    constraint = vocab.compile(setup.grammar()).start()
    for token in model.tokenize(text, parse_special=True):
        if not constraint.push(token):
            return False, False
    return True, constraint.is_accepting()


@pytest.mark.parametrize("syntax", sorted(CALLS))
def test_a_required_call_grammar_compiles_and_admits_a_valid_call(smol, syntax):
    model, vocab = smol
    setup = ToolSetup(syntax, (WEATHER,), "required", parallel=False)
    assert walk(vocab, setup, model, CALLS[syntax]) == (True, True), syntax
    assert setup.parse(CALLS[syntax])[1]
    invalid = CALLS[syntax].replace("city", "town")  # a parameter the function does not declare
    assert walk(vocab, setup, model, invalid)[0] is False
    assert walk(vocab, setup, model, "Hello")[0] is False  # a required call is a call


@pytest.mark.parametrize("syntax", ["hermes", "qwen35", "mistral", "gemma4", "functiongemma"])
def test_auto_is_free_text_until_the_marker_and_then_a_valid_call(smol, syntax):
    model, vocab = smol
    setup = ToolSetup(syntax, (WEATHER,), "auto", free_specials=vocab.special_ids)
    assert walk(vocab, setup, model, "Paris is sunny, I think. <b>bold</b> [x]") == (True, True)
    # free text holds the vocabulary's other special tokens (a thinking model's </think>: here <repo_name>)
    assert walk(vocab, setup, model, "<repo_name>thought<repo_name>\n" + CALLS[syntax]) == (True, True)
    assert walk(vocab, ToolSetup(syntax, (WEATHER,), "auto"), model, "<repo_name>x")[0] is False  # the control
    assert walk(vocab, setup, model, "Let me look.\n" + CALLS[syntax]) == (True, True)
    assert walk(vocab, setup, model, "Let me look.\n" + CALLS[syntax].replace("city", "town"))[0] is False
    two = "Let me look.\n" + CALLS[syntax] + CALLS[syntax]
    if syntax == "mistral":  # its calls are one array
        one = CALLS[syntax].removeprefix("[TOOL_CALLS][").removesuffix("]")
        two = f"Let me look.\n[TOOL_CALLS][{one},{one}]"
    assert walk(vocab, setup, model, two)[0] is True  # parallel calls
    assert walk(vocab, ToolSetup(syntax, (WEATHER,), "auto", parallel=False), model, two)[0] is False


def test_a_marker_the_vocabulary_holds_as_one_special_token_is_matched_by_it(smol):
    """A real Mistral or Gemma 4 writes its marker as one control token, which renders as no text: the grammar names
    the token by id (here SmolLM2's `<|im_start|>` stands in for `<|tool_call>`), and the answer is parsed with the
    marker written out."""
    model, vocab = smol
    marker = model.tokenize("<|im_start|>", parse_special=True)
    assert len(marker) == 1
    others = tuple(i for i in vocab.special_ids if i != marker[0])
    setup = ToolSetup("gemma4", (WEATHER,), "auto", specials={"<|tool_call>": marker[0]}, free_specials=others)
    assert walk(vocab, setup, model, "Let me <repo_name> look.") == (True, True)
    call = 'call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
    assert walk(vocab, setup, model, "Let me look. <|im_start|>" + call) == (True, True)
    assert walk(vocab, setup, model, "Let me look. <|im_start|>" + call.replace("city", "town"))[0] is False
    required = ToolSetup("gemma4", (WEATHER,), "required", specials={"<|tool_call>": marker[0]})
    assert walk(vocab, required, model, "<|im_start|>" + call) == (True, True)
    assert walk(vocab, required, model, "<|tool_call>" + call)[0] is False  # the text is not the token
    tokens = model.tokenize("Let me look. <|im_start|>" + call, parse_special=True)
    text = setup.marked_text(tokens, model.token_bytes)
    assert setup.parse(text)[1][0]["function"]["name"] == "get_weather"


def test_the_round_trip_renders_through_qwen3s_template(thinking_models):
    model = Model(thinking_models.target, vocab_only=True)
    try:
        fmt = ChatFormat(model)
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        }
        messages = [
            Message("user", "Weather in Oslo?"),
            Message("assistant", "", tool_calls=(call,)),
            Message("tool", "sunny, 3 degrees", tool_call_id="call_1"),
        ]
        tools = ToolSetup("hermes", (WEATHER,), "auto").openai_tools()
        text = model.detokenize(fmt.tokens(messages, tools=tools))
        assert "<tools>" in text and '"get_weather"' in text  # the tools, by the template
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in text
        assert "<tool_response>\nsunny, 3 degrees\n</tool_response>" in text
    finally:
        model.close()


def test_a_marker_is_special_where_the_grammar_vocabulary_says_so(smol):
    """What the server names by id: a marker that is one token of the vocabulary's special ones (SmolLM2's
    `<|im_start|>` here), not a marker its text spells in pieces."""
    model, vocab = smol
    assert special_markers(model, ["<|im_start|>", "<tool_call>", "[TOOL_CALLS]"], vocab.special_ids) == {
        "<|im_start|>": 1
    }


@pytest.mark.parametrize("syntax", sorted(CALLS))
@pytest.mark.parametrize("choice", ["required", "auto"])
def test_a_keyword_the_library_lacks_is_left_out_of_a_calls_constraint(smol, syntax, choice):
    """Claude Code's tools use `propertyNames`, which llguidance does not implement: every request that offered them
    was a 400 (found trying Claude Code against `serve`). A tool's schema now constrains what the library can; the
    rest is the client's to check. (`response_format` stays strict: tests/server/test_serve_grammar.py.)"""
    model, vocab = smol
    keyed = Function(
        "get_weather",
        "The weather",
        {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "tags": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}},
            },
            "required": ["city"],
        },
    )
    setup = ToolSetup(syntax, (keyed,), choice, free_specials=vocab.special_ids)
    if choice == "auto" and syntax == "llama3":
        assert setup.grammar() is None  # free text, parsed after
        return
    assert walk(vocab, setup, model, CALLS[syntax]) == (True, True), syntax
    assert walk(vocab, setup, model, CALLS[syntax].replace("city", "town"))[0] is False  # still closed to its keys


def _list(syntax: str, cities: list[str], cut: bool = False) -> str:
    """The calls get_weather(city) for each city as `syntax` writes a list of them; `cut`: cut inside the last
    city's name, as max_tokens would."""
    if syntax == "generic":
        text = json.dumps({"tool_calls": [{"name": "get_weather", "arguments": {"city": c}} for c in cities]})
    elif syntax == "mistral":
        text = "[TOOL_CALLS]" + json.dumps([{"name": "get_weather", "arguments": {"city": c}} for c in cities])
    else:
        text = "".join(CALLS[syntax].replace("Paris", c) for c in cities)
    return text[: text.rindex(cities[-1]) + 2] if cut else text


LISTS = ["hermes", "qwen35", "mistral", "gemma4", "functiongemma", "generic"]  # Llama 3.x's call is one object


@pytest.mark.parametrize("syntax", LISTS)
@pytest.mark.parametrize("choice", ["required", "auto"])
def test_a_list_cut_short_keeps_its_complete_calls_and_no_json_as_text(syntax, choice):
    """max_tokens inside the third call (issue 55): before, the whole answer was content, with no calls."""
    setup = ToolSetup(syntax, (WEATHER,), choice)
    content, calls = setup.parse(_list(syntax, ["Paris", "Oslo", "Rome"], cut=True))
    assert [json.loads(c["function"]["arguments"])["city"] for c in calls] == ["Paris", "Oslo"]
    assert content is None
    assert setup.parse(_list(syntax, ["Rome"], cut=True)) == (None, [])  # no call complete yet: nothing to say
    if syntax in ("hermes", "qwen35", "gemma4", "functiongemma"):  # where text may come before a call (`auto`)
        content, calls = setup.parse("Let me look.\n" + _list(syntax, ["Rome"], cut=True))
        assert calls == [] and content == ("Let me look." if choice == "auto" else None)


def test_a_generic_response_cut_short_is_its_text_so_far():
    setup = ToolSetup("generic", (WEATHER,), "auto")
    assert setup.parse('{"response": "It is sunny \\u00e9t\\u00') == ("It is sunny \u00e9t", [])
    assert setup.parse('{"response": "Hi') == ("Hi", [])


@pytest.mark.parametrize("syntax", LISTS)
def test_a_call_identical_to_an_earlier_one_ends_the_list(syntax):
    setup = ToolSetup(syntax, (WEATHER,), "required")
    text = _list(syntax, ["Paris", "Oslo", "Paris", "Rome"])
    assert [json.loads(c["function"]["arguments"])["city"] for c in setup.parse(text)[1]] == ["Paris", "Oslo"]
    assert setup.repeats(text) and setup.repeats(_list(syntax, ["Paris", "Paris"]))
    assert not setup.repeats(_list(syntax, ["Paris", "Oslo", "Rome"]))
    assert not setup.repeats(_list(syntax, ["Paris", "Oslo", "Paris"], cut=True))  # the repeat is not complete yet


@pytest.mark.parametrize(
    "syntax,text",
    [
        ("llama3", '{"name": "get_weather", "parameters": {"city": NaN}}'),
        ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "t": Infinity}}'),
        ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris", "t": 1e999}}'),
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": -Infinity}}\n</tool_call>'),
        ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"t": NaN}}]'),
        ("generic", '{"tool_calls": [{"name": "get_weather", "arguments": {"t": NaN}}]}'),
        ("gemma4", "<|tool_call>call:get_weather{t:NaN}<tool_call|>"),
    ],
)
def test_a_value_json_cannot_hold_makes_no_call_and_stays_text(syntax, text):
    """Python reads NaN, Infinity and 1e999 (as inf); a client's JSON parser does not: a call with one is no call,
    and the model's text stays its content (Llama 3.x in `auto` writes free text)."""
    content, calls = ToolSetup(syntax, (WEATHER,), "auto").parse(text)
    assert calls == [] and content == text


@pytest.mark.parametrize(
    "syntax,text",
    [
        ("hermes", '<tool_call>\n{"name": {"a": 1}, "arguments": {}}\n</tool_call>'),
        ("hermes", '<tool_call>\n{"name": ["get_weather"], "arguments": {"city": "Paris"}}\n</tool_call>'),
        ("generic", '{"tool_calls": [{"name": {"x": 1}, "arguments": {}}, {"name": 3, "arguments": {}}]}'),
        ("mistral", '[TOOL_CALLS][{"name": null, "arguments": {}}]'),
        ("llama3", '{"name": ["get_weather"], "parameters": {}}'),
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": [1, 2]}\n</tool_call>'),
    ],
)
def test_a_name_that_is_not_a_string_or_arguments_not_an_object_is_no_call(syntax, text):
    """A non-string name was a 500 (an unhashable name looked up among the tools)."""
    assert ToolSetup(syntax, (WEATHER,), "auto").parse(text) == (text, [])


def test_arguments_written_as_a_json_string_are_read_as_the_object():
    text = '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n</tool_call>'
    [call] = ToolSetup("hermes", (WEATHER,), "auto").parse(text)[1]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


ODD_KEYS = Function(
    "f",
    "",
    {
        "type": "object",
        "properties": {
            "city name": {"type": "string"},
            "2fa": {"type": "integer"},
            "città": {"type": "string"},
            "a:b": {"type": "integer"},
            "$x": {"type": "object"},
        },
        "required": ["city name"],
    },
)


@pytest.mark.parametrize("syntax", ["gemma4", "functiongemma"])
def test_gemma_keys_that_are_not_bare_identifiers_are_read(smol, syntax):
    """The grammar writes a parameter's name as it is (`city name:`); the parser read only identifier-like keys, so a
    required call to such a tool came back with no call. A JSON string inside a nested value keeps its `, b:`."""
    model, vocab = smol
    q = '<|"|>' if syntax == "gemma4" else "<escape>"
    opened, close = ("<|tool_call>", "<tool_call|>") if syntax == "gemma4" else (
        "<start_function_call>", "<end_function_call>"
    )  # fmt: skip
    text = f'{opened}call:f{{city name:{q}Paris{q},2fa:12,città:{q}x{q},a:b:3,$x:{{"k":"a, b:c"}}}}{close}'
    setup = ToolSetup(syntax, (ODD_KEYS,), "required")
    assert walk(vocab, setup, model, text) == (True, True)
    [call] = setup.parse(text)[1]
    assert json.loads(call["function"]["arguments"]) == {
        "city name": "Paris",
        "2fa": 12,
        "città": "x",
        "a:b": 3,
        "$x": {"k": "a, b:c"},
    }
    nested = f"{opened}call:f{{city name:{q}P{q},$x:{{in ner:[1,{{k:{q}v{q}}}]}}}}{close}"  # a model's own nesting
    assert json.loads(setup.parse(nested)[1][0]["function"]["arguments"])["$x"] == {"in ner": [1, {"k": "v"}]}


class Address(BaseModel):
    city: str
    country: str = Field(max_length=12)


class Deliver(BaseModel):
    to: Address
    also: list[Address] = []


DELIVER = Function("deliver", "", Deliver.model_json_schema())
DELIVER_CALL = {"to": {"city": "Paris", "country": "France"}}
DELIVER_CALLS = {
    "hermes": '<tool_call>\n{"name":"deliver","arguments":ARGS}\n</tool_call>',
    "llama3": '{"name":"deliver","parameters":ARGS}',
    "mistral": '[TOOL_CALLS][{"name":"deliver","arguments":ARGS}]',
    "generic": '{"tool_calls":[{"name":"deliver","arguments":ARGS}]}',
    "qwen35": "<tool_call>\n<function=deliver>\n<parameter=to>\n@TO@\n</parameter>\n</function>\n</tool_call>",
    "gemma4": "<|tool_call>call:deliver{to:@TO@}<tool_call|>",
    "functiongemma": "<start_function_call>call:deliver{to:@TO@}<end_function_call>",
}


@pytest.mark.parametrize("syntax", sorted(DELIVER_CALLS))
@pytest.mark.parametrize("choice", ["required", "auto"])
def test_a_tool_whose_parameters_use_defs_and_refs_constrains_its_call(smol, syntax, choice):
    """pydantic's (and `openai.pydantic_function_tool`'s, the MCP SDK's) nested model: `$defs` and `#/$defs/Address`.
    Before, the grammar held the tool's schema inside the call's, where the pointer finds nothing: a 400 "Pointer
    '/$defs/Address' does not exist" on every route."""
    model, vocab = smol
    assert "$defs" in DELIVER.parameters
    setup = ToolSetup(syntax, (WEATHER, DELIVER), choice, free_specials=vocab.special_ids)
    if setup.grammar() is None:  # Llama 3.x `auto`: free text
        return
    args, to = (json.dumps(v, separators=(",", ":")) for v in (DELIVER_CALL, DELIVER_CALL["to"]))
    text = DELIVER_CALLS[syntax].replace("ARGS", args).replace("@TO@", to)
    assert walk(vocab, setup, model, text) == (True, True), syntax
    assert json.loads(setup.parse(text)[1][0]["function"]["arguments"]) == DELIVER_CALL
    too_long = text.replace("France", "The French Republic")  # maxLength 12, inside the referred definition
    assert walk(vocab, setup, model, too_long)[0] is False, syntax
    invented = text.replace('"country"', '"county"')  # a key the nested model does not declare
    assert walk(vocab, setup, model, invented)[0] is False, syntax


UNENDING = {"$defs": {"A": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"]}}}


@pytest.mark.parametrize(
    "schema,ends",
    [
        ({**UNENDING, "$ref": "#/$defs/A"}, False),  # the issue's schema
        ({**UNENDING, "type": "object", "properties": {"x": {"$ref": "#/$defs/A"}}, "required": ["x"]}, False),
        ({**UNENDING, "type": "object", "properties": {"x": {"$ref": "#/$defs/A"}}}, True),  # optional: {} ends
        ({"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]}, False),
        (
            {"type": "object", "properties": {"n": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["n"]},
            True,
        ),
        ({"type": "object", "properties": {"n": {"type": "array", "items": {"$ref": "#"}}}, "required": ["n"]}, True),
        (
            {
                "type": "object",
                "properties": {"n": {"type": "array", "items": {"$ref": "#"}, "minItems": 1}},
                "required": ["n"],
            },
            False,
        ),  # fmt: skip
        (Deliver.model_json_schema(), True),
    ],
)
def test_a_ref_with_no_way_to_end_is_refused_before_decoding(schema, ends):
    """Before: it compiled, and the answer was an empty "stop" (or a parser error mid-answer with a state dump)."""
    if ends:
        Grammar.json_schema(schema)
        ToolSetup("hermes", (Function("f", "", schema),), "required").grammar()
        return
    with pytest.raises(GrammarError, match="requires itself with no way to end"):
        Grammar.json_schema(schema)
    with pytest.raises(GrammarError, match="the parameters schema of tool 'f' has '#.*requires itself"):
        ToolSetup("qwen35", (Function("f", "", schema),), "required").grammar()


def test_a_choice_wider_than_the_library_holds_is_refused_before_decoding(smol):
    """A 3,000-way anyOf compiled, then failed once the answer reached it with llguidance's state dump."""
    model, vocab = smol
    branch = [{"type": "object", "properties": {"k": {"const": i}}, "required": ["k"]} for i in range(3000)]
    for wide in ({"anyOf": branch}, {"anyOf": [{"anyOf": branch[:1500]}, {"oneOf": branch[1500:]}]}):
        with pytest.raises(GrammarError, match="a choice of 3000 object or array alternatives at /anyOf"):
            Grammar.json_schema(wide)
    vocab.compile(Grammar.json_schema({"anyOf": branch[:2000]})).start()  # the library's own limit, 2000
    vocab.compile(Grammar.json_schema({"enum": list(range(3000))})).start()  # one lexeme: no limit
    many = tuple(Function(f"f{i}", "", {"type": "object"}) for i in range(2001))
    with pytest.raises(GrammarError, match="2001 tools are offered"):
        ToolSetup("hermes", many, "required").grammar()


def test_a_schema_nested_deeper_than_the_library_reads_is_refused_without_recursing():
    """The checks above recurse: a schema 600 levels deep (within what a body's JSON may hold) meets a depth check
    first, not a RecursionError (a 500)."""
    schema: dict = {"type": "string"}
    for _ in range(300):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    with pytest.raises(GrammarError, match="nests 601 levels deep: the grammar library reads at most 128"):
        Grammar.json_schema(schema)
    for syntax in ("generic", "qwen35"):
        with pytest.raises(GrammarError, match="schema of tool 'f' nests 601 levels deep"):
            ToolSetup(syntax, (Function("f", "", schema),), "required").grammar()
