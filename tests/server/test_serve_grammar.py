"""Structured output over HTTP (issue 46): `response_format` with the real `openai` client against a real
`localspec serve` of SmolLM2 drafting for itself (a real chat model: the answers are JSON a person would write),
speculation on; and a schema the library cannot compile is a 400 naming the field.
"""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel
from support.server import start_server


class Person(BaseModel):
    name: str
    age: int
    city: str


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    home = tmp_path_factory.mktemp("grammar-home")
    (home / "models.toml").write_text(
        f'default = "smol"\n[pairs.smol]\ntarget = {{ path = "{smollm2_path}" }}\n'
        f'draft = {{ path = "{smollm2_path}" }}\ntemperature = 0.0\nn_ctx = 2048\n',
        encoding="utf-8",
    )
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
