"""Tool-call syntaxes (core/tools.py, issue 46): told from the template, written as each family writes them,
constrained where a call is required, parsed back; and the round trip rendered by Qwen3's real template."""

from __future__ import annotations

import json

import pytest
from support.tinymodels import qwen3_template

from localspec.core.grammar import GrammarVocab
from localspec.core.session import ChatFormat, Message
from localspec.core.tools import Function, ToolSetup, detect_syntax
from localspec.llama.model import Model
from localspec.llama.templates import template_variables
from localspec.llama.vocab import grammar_pieces, grammar_tokenizer

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


@pytest.mark.parametrize(
    "template,syntax",
    [(qwen3_template(), "hermes"), (LLAMA3, "llama3"), (MISTRAL, "mistral"), ("{{ messages }}", "generic")],
)
def test_the_syntax_is_told_from_the_template(template, syntax):
    assert detect_syntax(template, template_variables(template)) == syntax


@pytest.mark.parametrize(
    "syntax,text",
    [
        ("hermes", 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
        ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'),
        ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
        ("generic", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'),
    ],
)
def test_each_syntax_is_parsed_into_openai_tool_calls(syntax, text):
    content, calls = ToolSetup(syntax, (WEATHER,), "auto").parse(text)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    assert content == ("Sure." if syntax == "hermes" else None)


def test_text_without_a_call_is_content_and_an_unknown_function_is_not_a_call():
    setup = ToolSetup("hermes", (WEATHER,), "auto")
    assert setup.parse("Just text.") == ("Just text.", [])
    assert setup.parse('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>')[1] == []
    assert ToolSetup("generic", (WEATHER,), "auto").parse('{"response": "Hi"}') == ("Hi", [])


@pytest.mark.parametrize("syntax", ["hermes", "llama3", "mistral", "generic"])
def test_a_required_call_grammar_compiles_and_admits_a_valid_call(smollm2_path, syntax):
    model = Model(smollm2_path, vocab_only=True)
    try:
        vocab = GrammarVocab(grammar_pieces(model), sorted(model.eog_tokens()), grammar_tokenizer(model))
        setup = ToolSetup(syntax, (WEATHER,), "required", parallel=False)
        constraint = vocab.compile(setup.grammar()).start()
        written = {
            "hermes": '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>\n',
            "llama3": '{"name":"get_weather","parameters":{"city":"Paris"}}',
            "mistral": '[TOOL_CALLS][{"name":"get_weather","arguments":{"city":"Paris"}}]',
            "generic": '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}',
        }[syntax]
        for token in model.tokenize(written):
            assert constraint.push(token), (syntax, model.token_bytes(token))
        assert constraint.is_accepting()
        assert setup.parse(written)[1]
    finally:
        model.close()


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
