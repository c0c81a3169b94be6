"""Tool calls at their edges over HTTP (issue 55), with the real `openai` and `anthropic` clients against a real
`localspec serve` of SmolLM2 drafting for itself: a call list that repeats its call ends at the repeat and one cut
by max_tokens keeps its complete calls, on chat completions, Responses and Messages; tools whose parameters use
`$defs`/`$ref` (pydantic's, `openai.pydantic_function_tool`'s, the MCP SDK's) are called; a schema no grammar can
follow — a `$ref` with no way to end, a 3,000-way choice — is a one-line 400 before anything is decoded.
"""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest
from pydantic import BaseModel

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather", "parameters": CITY}}
ASK = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
UNENDING = {
    "type": "object",
    "$defs": {"A": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"]}},
    "properties": {"a": {"$ref": "#/$defs/A"}},
    "required": ["a"],
}
WIDE = {
    "type": "object",
    "properties": {
        "x": {"anyOf": [{"type": "object", "properties": {"k": {"const": i}}, "required": ["k"]} for i in range(3000)]}
    },
    "required": ["x"],
}


@pytest.fixture(scope="module")
def server(smol_server):
    return smol_server  # conftest.py: SmolLM2, one per module


@pytest.fixture
def claude(smol_claude):
    return smol_claude


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()]


def test_a_repeated_call_ends_the_list_on_every_route(server, claude):
    """SmolLM2 asked for a required call with parallel calls on writes its call again and again: before, the list
    ran to max_tokens and came back as cut JSON in `content`, no calls (a 135M model's habit, any model's risk)."""
    chat = server.client().chat.completions.create(
        model="smol", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=300
    )
    choice = chat.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    calls = _calls(choice.message)
    assert calls and len({json.dumps(c, sort_keys=True) for c in calls}) == len(calls)  # no call twice
    assert chat.usage.completion_tokens < 300  # it stopped at the repeat
    for _, arguments in calls:
        jsonschema.validate(arguments, CITY)

    response = server.client().responses.create(
        model="smol", input=ASK[0]["content"], tools=[{"type": "function", "name": "get_weather", "parameters": CITY}],
        tool_choice="required", max_output_tokens=300,
    )  # fmt: skip
    assert response.status == "completed" and not response.output_text
    assert [(o.name, json.loads(o.arguments)) for o in response.output if o.type == "function_call"] == calls

    message = claude.messages.create(
        model="smol", max_tokens=300, messages=ASK, tool_choice={"type": "any"},
        tools=[{"name": "get_weather", "description": "The weather", "input_schema": CITY}],
    )  # fmt: skip
    assert message.stop_reason == "tool_use" and [b.type for b in message.content] == ["tool_use"] * len(calls)
    assert [(b.name, b.input) for b in message.content] == calls


def test_a_list_cut_by_max_tokens_keeps_its_complete_calls(server, claude):
    """max_tokens two tokens short of the repeat: the list is cut inside its last call; the calls before it come back
    (finish `length`), never the cut JSON as text."""
    whole = server.client().chat.completions.create(
        model="smol", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=300
    )
    calls = _calls(whole.choices[0].message)
    cut_at = whole.usage.completion_tokens - 2
    cut = server.client().chat.completions.create(
        model="smol", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=cut_at
    )
    assert cut.choices[0].finish_reason == "length" and cut.choices[0].message.content is None
    assert _calls(cut.choices[0].message) == calls
    streamed = [c for c in server.client().chat.completions.create(
        model="smol", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=cut_at, stream=True
    )]  # fmt: skip
    deltas = [d for c in streamed if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert [json.loads(d.function.arguments) for d in deltas if d.function.arguments] == [a for _, a in calls]
    assert not any(c.choices and c.choices[0].delta.content for c in streamed)

    response = server.client().responses.create(
        model="smol", input=ASK[0]["content"], tools=[{"type": "function", "name": "get_weather", "parameters": CITY}],
        tool_choice="required", max_output_tokens=cut_at,
    )  # fmt: skip
    assert response.status == "incomplete" and not response.output_text
    assert [(o.name, json.loads(o.arguments)) for o in response.output if o.type == "function_call"] == calls
    message = claude.messages.create(
        model="smol", max_tokens=cut_at, messages=ASK, tool_choice={"type": "any"},
        tools=[{"name": "get_weather", "description": "The weather", "input_schema": CITY}],
    )  # fmt: skip
    assert message.stop_reason == "max_tokens" and [(b.name, b.input) for b in message.content] == calls


class Address(BaseModel):
    city: str
    country: str


class Deliver(BaseModel):
    """Deliver a parcel."""

    to: Address
    express: bool


def test_a_tool_with_defs_and_refs_is_called_on_every_route(server, claude):
    """pydantic writes a nested model as `$defs` and `$ref`: before, every route answered 400 "Pointer '/$defs/
    Address' does not exist" (the tool's schema was placed inside the call's, away from its root)."""
    tool = openai.pydantic_function_tool(Deliver)
    schema = tool["function"]["parameters"]
    assert "$defs" in schema
    ask = [{"role": "user", "content": "Send the parcel to Paris, France, express."}]
    chat = server.client().chat.completions.create(
        model="smol", messages=ask, tools=[tool], tool_choice="required", parallel_tool_calls=False, max_tokens=120
    )
    [(name, arguments)] = _calls(chat.choices[0].message)
    assert name == "Deliver" and chat.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(arguments, schema)
    Deliver.model_validate(arguments)

    response = server.client().responses.create(
        model="smol", input=ask[0]["content"], tools=[{"type": "function", "name": "Deliver", "parameters": schema}],
        tool_choice="required", parallel_tool_calls=False, max_output_tokens=120,
    )  # fmt: skip
    [call] = [o for o in response.output if o.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), schema)
    message = claude.messages.create(
        model="smol", max_tokens=120, messages=ask,
        tools=[{"name": "Deliver", "description": "Deliver a parcel.", "input_schema": Deliver.model_json_schema()}],
        tool_choice={"type": "tool", "name": "Deliver", "disable_parallel_tool_use": True},
    )  # fmt: skip
    [use] = [b for b in message.content if b.type == "tool_use"]
    jsonschema.validate(use.input, Deliver.model_json_schema())


@pytest.mark.parametrize(
    "parameters,match",
    [(UNENDING, "'#/$defs/A', which requires itself with no way to end"), (WIDE, "a choice of 3000")],
)
def test_a_schema_no_grammar_can_follow_is_one_400_line_on_every_route(server, claude, parameters, match):
    """Before: the unending `$ref` answered an empty "stop", the 3,000-way anyOf failed once generation began with
    llguidance's state dump."""
    with pytest.raises(openai.BadRequestError) as e:  # a response_format schema is checked alike
        server.client().chat.completions.create(
            model="smol", messages=ASK,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": parameters}},
        )  # fmt: skip
    error = e.value.body
    assert error["param"].startswith("response_format") and match in error["message"], error
    assert "\n" not in error["message"] and len(error["message"]) < 400
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    with pytest.raises(openai.BadRequestError) as e:  # checked before the tools are taught in the prompt
        server.client().chat.completions.create(model="smol", messages=ASK, tools=[tool], tool_choice="required")
    error = e.value.body
    assert error["param"] == "tools" and match in error["message"] and "'f'" in error["message"], error
    with pytest.raises(openai.BadRequestError) as e:
        server.client().responses.create(
            model="smol", input="x", tools=[{"type": "function", "name": "f", "parameters": parameters}],
            tool_choice="required",
        )  # fmt: skip
    assert match in e.value.body["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(
            model="smol", max_tokens=20, messages=ASK, tool_choice={"type": "any"},
            tools=[{"name": "f", "input_schema": parameters}],
        )  # fmt: skip
    assert match in e.value.body["error"]["message"]
