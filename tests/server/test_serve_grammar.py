"""Structured output over HTTP (issue 46): `response_format` with the real `openai` client against a real
`localspec serve` of SmolLM2 drafting for itself (a real chat model: the answers are JSON a person would write),
speculation on; and a schema the library cannot compile is a 400 naming the field.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel
from support.server import start_server, write_smol_home


class Person(BaseModel):
    name: str
    age: int
    city: str


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    home = write_smol_home(tmp_path_factory.mktemp("grammar-home"), smollm2_path)
    running = start_server(home, "--draft-max", "4", "--no-adaptive")
    yield running
    running.stop()


ASK = [{"role": "user", "content": "Give me a person who lives in Paris, as JSON with name, age and city."}]


def test_parse_returns_a_validated_object_with_speculation_on(server):
    client = server.client()
    completion = client.chat.completions.parse(model="smol", messages=ASK, response_format=Person, max_tokens=120)
    person = completion.choices[0].message.parsed
    assert isinstance(person, Person) and person.name
    assert completion.choices[0].finish_reason == "stop"
    raw = completion.model_dump()
    assert raw["timings"]["draft_n_accepted"] > 0  # drafted under the same grammar, and accepted


def test_json_object_is_a_json_object(server):
    reply = server.client().chat.completions.create(
        model="smol", messages=ASK, response_format={"type": "json_object"}, max_tokens=120
    )
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_completions_take_a_schema_too(server):
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}
    reply = server.client().completions.create(
        model="smol",
        prompt="Is Paris in France? Answer in JSON: ",
        max_tokens=30,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}},
    )
    assert json.loads(reply.choices[0].text)["answer"] in ("yes", "no")


def test_a_grammar_that_cannot_finish_ends_on_length_with_the_text_so_far(server):
    schema = {"type": "object", "properties": {"story": {"type": "string", "minLength": 500}}, "required": ["story"]}
    reply = server.client().chat.completions.create(
        model="smol",
        messages=ASK,
        max_tokens=12,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}},
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content.startswith('{"story":"')


@pytest.mark.parametrize(
    "response_format,param,match",
    [
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "if": {}, "then": {}}}},
            "response_format",
            "Unimplemented keys",
        ),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}, "response_format", "nope"),
        ({"type": "json_schema"}, "response_format", "json_schema"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema", "schema"),
        ({"type": "yaml"}, "response_format.type", "json_object"),
    ],
)
def test_a_schema_that_cannot_be_used_is_a_400_naming_the_field(server, response_format, param, match):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(model="smol", messages=ASK, response_format=response_format)
    error = e.value.body
    assert error["param"] == param and match in error["message"], error
    assert server.client().chat.completions.create(model="smol", messages=ASK, max_tokens=2).choices  # still serving


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
        },
    },
}
WEATHER_ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _call_is_valid(call, name: str) -> dict:
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == name
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, {"get_weather": WEATHER, "get_time": TIME}[name]["function"]["parameters"])
    return arguments


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_a_required_or_named_tool_call_comes_back_parsed_and_valid(server, choice):
    reply = server.client().chat.completions.create(
        model="smol",
        messages=WEATHER_ASK,
        tools=[WEATHER, TIME],
        tool_choice=choice,
        parallel_tool_calls=False,  # one call: a 135M model asked for many may repeat itself to the end
        max_tokens=120,
    )
    choice0 = reply.choices[0]
    assert choice0.finish_reason == "tool_calls" and len(choice0.message.tool_calls) == 1, choice0
    name = "get_time" if isinstance(choice, dict) else choice0.message.tool_calls[0].function.name
    for call in choice0.message.tool_calls:
        _call_is_valid(call, name if isinstance(choice, dict) else call.function.name)


def test_streamed_tool_call_deltas_reassemble_to_the_whole_call(server):
    body = dict(model="smol", messages=WEATHER_ASK, tools=[WEATHER], tool_choice="required", max_tokens=120, seed=1)
    body["parallel_tool_calls"] = False
    whole = server.client().chat.completions.create(**body).choices[0].message.tool_calls
    calls: dict[int, dict] = {}
    finish = None
    for chunk in server.client().chat.completions.create(**body, stream=True):
        if not chunk.choices:
            continue
        for delta in chunk.choices[0].delta.tool_calls or ():
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += delta.id or ""
            call["name"] += (delta.function and delta.function.name) or ""
            call["arguments"] += (delta.function and delta.function.arguments) or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        (c.function.name, json.loads(c.function.arguments)) for c in whole
    ]


def test_the_round_trip_with_tool_messages(server):
    client = server.client()
    first = client.chat.completions.create(
        model="smol",
        messages=WEATHER_ASK,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=120,
        parallel_tool_calls=False,
    )
    message = first.choices[0].message
    messages = [*WEATHER_ASK, message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": c.id, "content": '{"temperature": 21}'} for c in message.tool_calls]
    second = client.chat.completions.create(model="smol", messages=messages, tools=[WEATHER], max_tokens=60)
    assert second.choices[0].finish_reason in ("stop", "tool_calls", "length")
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as e:  # a result that answers no call
        client.chat.completions.create(
            model="smol", messages=[*messages[:-1], {"role": "tool", "tool_call_id": "call_nope", "content": "x"}]
        )
    assert "call_nope" in e.value.body["message"]


@pytest.mark.parametrize(
    "body,match",
    [
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]}, "object"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
    ],
)
def test_bad_tools_are_a_400_naming_the_field(server, body, match):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(model="smol", messages=WEATHER_ASK, **body)
    assert match in e.value.body["message"], e.value.body


def test_tool_choice_none_answers_in_text(server):
    reply = server.client().chat.completions.create(
        model="smol", messages=WEATHER_ASK, tools=[WEATHER], tool_choice="none", max_tokens=10
    )
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].message.content
