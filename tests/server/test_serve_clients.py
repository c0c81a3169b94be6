"""The real `anthropic` and `openai` clients against a real `localspec serve` of SmolLM2 drafting for itself (a real
chat model, speculation on; issue 47): Messages (text, stream, a required tool with a valid `tool_use` input, the
`tool_result` round trip) and Responses (text, stream, a required function call, the `function_call_output` round
trip through `previous_response_id`)."""

from __future__ import annotations

import json

import jsonschema
import pytest

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
ASK = "What is the weather in Paris? Use the tool."


@pytest.fixture(scope="module")
def server(smol_server):
    return smol_server  # conftest.py: SmolLM2, one per module


@pytest.fixture
def claude(smol_claude):
    return smol_claude


def test_messages_text_and_stream_with_draft_tokens_accepted(claude):
    ask = dict(model="smol", max_tokens=24, messages=[{"role": "user", "content": "Name three colours."}])
    whole = claude.messages.create(**ask)
    assert whole.type == "message" and whole.role == "assistant" and whole.content[0].type == "text"
    assert whole.content[0].text.strip() and whole.stop_reason in ("end_turn", "max_tokens")
    assert whole.model_extra["timings"]["draft_n_accepted"] > 0
    with claude.messages.stream(**ask) as stream:
        text = "".join(stream.text_stream)
    assert text == whole.content[0].text


def test_messages_a_named_tool_gives_a_valid_tool_use_and_the_result_goes_back(claude):
    tools = [{"name": "get_weather", "description": "The weather in a city", "input_schema": CITY}]
    choice = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    first = claude.messages.create(
        model="smol",
        max_tokens=80,
        messages=[{"role": "user", "content": ASK}],
        tools=tools,
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
    )
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and use.name == "get_weather"
    jsonschema.validate(use.input, CITY)
    with claude.messages.stream(
        model="smol",
        max_tokens=80,
        messages=[{"role": "user", "content": ASK}],
        tools=tools,
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
    ) as stream:
        streamed = stream.get_final_message()
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [(use.name, use.input)]
    second = claude.messages.create(
        model="smol",
        max_tokens=30,
        tools=tools,
        messages=[
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 C, sunny"}]},
        ],
    )
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens > first.usage.input_tokens
    count = claude.messages.count_tokens(  # the same prompt: the tools and the choice are taught in it
        model="smol", messages=[{"role": "user", "content": ASK}], tools=tools, tool_choice=choice
    )
    assert count.input_tokens == first.usage.input_tokens + first.usage.cache_read_input_tokens


def test_responses_text_stream_and_previous_response_id(server):
    client = server.client()
    first = client.responses.create(model="smol", input="Name three colours.", max_output_tokens=24)
    assert first.output_text.strip() and first.status in ("completed", "incomplete")
    assert first.model_extra["timings"]["draft_n_accepted"] > 0
    events = list(client.responses.create(model="smol", input="Name three colours.", max_output_tokens=24,
                                          stream=True))  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == events[-1].response.status.join(
        ["response.", ""]
    )
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == first.output_text
    assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
    follow = client.responses.create(model="smol", input="And one more?", previous_response_id=first.id,
                                     max_output_tokens=16)  # fmt: skip
    assert follow.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert follow.previous_response_id == first.id


def test_responses_a_required_function_call_and_its_output_round_trip(server):
    client = server.client()
    tools = [{"type": "function", "name": "get_weather", "description": "The weather in a city", "parameters": CITY}]
    first = client.responses.create(
        model="smol", input=ASK, tools=tools, tool_choice="required", parallel_tool_calls=False, max_output_tokens=80
    )
    [call] = [o for o in first.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), CITY)
    events = list(client.responses.create(model="smol", input=ASK, tools=tools, tool_choice="required",
                                          parallel_tool_calls=False, max_output_tokens=80, stream=True))  # fmt: skip
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(deltas) == json.loads(call.arguments)
    assert "response.output_item.added" in [e.type for e in events] and events[-1].type == "response.completed"
    second = client.responses.create(
        model="smol",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 C, sunny"}],
        tools=tools,
        max_output_tokens=30,
    )
    assert second.status in ("completed", "incomplete") and second.output
    stateless = client.responses.create(  # the same round trip, every item sent again (store: false)
        model="smol",
        store=False,
        input=[
            {"role": "user", "content": ASK},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "21 C, sunny"},
        ],
        tools=tools,
        max_output_tokens=30,
    )
    assert stateless.output_text == second.output_text
