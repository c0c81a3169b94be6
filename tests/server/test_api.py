"""`server.api`: request bodies read strictly, in-process — every body is a request or a 400 naming what is wrong,
never another exception; unsupported fields are refused by name unless their value changes nothing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.core.grammar import GrammarVocab
from localspec.server.api import UNSUPPORTED, ApiError, parse_body
from localspec.server.chat_api import ChatBody, ChatRequest, CompletionBody, CompletionRequest
from localspec.server.messages_api import MessagesRequest
from localspec.server.responses_api import IGNORED as RESPONSES_IGNORED
from localspec.server.responses_api import UNSUPPORTED as RESPONSES_UNSUPPORTED
from localspec.server.responses_api import ResponsesRequest

HI = [{"role": "user", "content": "hi"}]


def body(**fields) -> bytes:
    return json.dumps({"messages": HI, **fields}).encode()


def test_a_full_request_reads_every_field():
    request = parse_body(
        body(
            model="tiny",
            stream=True,
            stream_options={"include_usage": True},
            max_completion_tokens=5,
            temperature=0.5,
            top_p=0.9,
            top_k=10,
            min_p=0.1,
            repeat_penalty=1.1,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            seed=2**64 - 1,
            stop=["a", "b"],
            n=2,
            draft_max=0,
            p_min=0.2,
            verify="match",
            drafter="ngram",
            adaptive=False,
            user="someone",
            logprobs=False,
            tools=[],
            response_format={"type": "text"},
        ),
        ChatRequest,
    )
    assert request.stops == ("a", "b") and request.n == 2 and request.stream_options.include_usage
    messages = [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert parse_body(json.dumps({"messages": messages}).encode(), ChatRequest).messages[0].text == "ab"
    assert parse_body(b'{"prompt": ["one"]}', CompletionRequest).text == "one"


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_each_unsupported_field_is_refused_by_name(name):
    with pytest.raises(ApiError) as caught:
        parse_body(body(**{name: {"some": "value"}}), ChatRequest)
    assert caught.value.status == 400 and caught.value.param == name
    assert caught.value.code == "unsupported_parameter"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": True}, "temperature"),  # a bool is not a number
        ({"n": 1.0}, "n"),
        ({"seed": -1}, "seed"),
        ({"stop": ["x"] * 17}, "stop"),
        ({"stop": 3}, "stop"),
        ({"verify": "auto"}, "verify"),
        ({"messages": [{"role": "user"}]}, "messages.0.content"),
        ({"messages": [{"role": "user", "content": "x", "nickname": "bob"}]}, "messages.0.nickname"),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "1"}]}]},
            "messages.0.tool_calls.0.function",
        ),
        ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "c1"}]}, "messages"),  # answers no call
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"stream_options": {"include_usage": True, "extra": 1}}, "stream_options.extra"),
    ],
)
def test_wrong_values_name_their_field(fields, param):
    with pytest.raises(ApiError) as caught:
        parse_body(body(**fields), ChatRequest)
    assert caught.value.status == 400 and caught.value.param == param, caught.value


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_bytes_are_a_request_or_a_400(data):
    for model in (ChatRequest, CompletionRequest):
        try:
            parse_body(data, model)
        except ApiError as e:
            assert e.status == 400 and e.message and "\n" not in e.message


def test_deep_nesting_is_a_400():
    with pytest.raises(ApiError):
        parse_body(b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", ChatRequest)


def test_a_lone_surrogate_is_refused_and_a_pair_is_text():
    with pytest.raises(ApiError) as caught:
        parse_body(body(model="\udcff"), ChatRequest)
    assert caught.value.code == "invalid_json" and "lone UTF-16 surrogate" in caught.value.message
    emoji = parse_body(body(messages=[{"role": "user", "content": "\ud83d\ude00"}]), ChatRequest)
    assert emoji.messages[0].content == "😀"
    assert ApiError(404, "no model '\udcff'").body()["error"]["message"].encode() == b"no model '\\udcff'"


@pytest.mark.parametrize(
    "raw_value",
    [b"1" + b"0" * 400, b"1e400", b"-1e400", b"[]", b"{}", b"true", b'"9' + b"9" * 400 + b'"', b'"soon"'],
    ids=["10**400", "1e400", "-1e400", "list", "object", "bool", "400-digit-string", "word"],
)
def test_a_keep_alive_that_is_no_finite_duration_is_a_400_naming_it(raw_value):
    """Before: 10**400 an OverflowError (a 500), 1e400 "not a valid integer", [] pydantic's words."""
    with pytest.raises(ApiError) as caught:
        parse_body(b'{"messages": ' + json.dumps(HI).encode() + b', "keep_alive": ' + raw_value + b"}", ChatRequest)
    error = caught.value
    assert (error.status, error.code, error.param) == (400, "invalid_value", "keep_alive"), error
    assert error.message.startswith("'keep_alive': keep_alive ") and len(error.message) < 200, error.message
    assert parse_body(body(keep_alive="5m"), ChatRequest).keep_alive == 300
    assert parse_body(body(keep_alive=-1), ChatRequest).keep_alive == float("inf")  # Ollama's forever
    assert parse_body(body(keep_alive=None), ChatRequest).keep_alive is None


# What frameworks send when a user sets it (issue 63 item 8): OpenAI's fields for its own service and llama-server's.
ACCEPTED_CHAT = {
    "reasoning_effort": "low",
    "verbosity": "low",
    "prompt_cache_key": "user-42",
    "safety_identifier": "hash-of-a-user",
    "prompt_cache_retention": "24h",
    "prediction": {"type": "content", "content": [{"type": "text", "text": "def f():"}]},
    "cache_prompt": False,
    "n_predict": 7,
    "id_slot": 0,
}


def test_the_options_frameworks_send_are_accepted_and_mapped_where_they_mean_something():
    chat = parse_body(body(**ACCEPTED_CHAT), ChatBody).to_request()
    assert chat.max_tokens == 7 and chat.think is True and chat.effort.setting == 'reasoning_effort = "low"'
    assert parse_body(body(n_predict=-1, reasoning_effort="none"), ChatBody).to_request().max_tokens is None
    assert parse_body(body(n_predict=9, max_tokens=3), ChatBody).to_request().max_tokens == 3
    off = parse_body(body(reasoning_effort="high", chat_template_kwargs={"enable_thinking": False}), ChatBody)
    assert off.to_request().think is False and off.to_request().effort is None  # the template's switch is precise
    completion = parse_body(b'{"prompt": "x", "n_predict": 5, "cache_prompt": true}', CompletionBody)
    assert completion.to_request().max_tokens == 5
    responses = parse_body(
        json.dumps(
            {
                "input": "hi",
                "truncation": "auto",
                "max_tool_calls": 3,
                "text": {"verbosity": "high"},
                "prompt_cache_retention": "in_memory",
                "reasoning": {"effort": "minimal"},
            }
        ).encode(),
        ResponsesRequest,
        unsupported=RESPONSES_UNSUPPORTED,
        ignored=RESPONSES_IGNORED,
    ).to_request()
    assert responses.think is True and responses.effort.field == "reasoning.effort"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"reasoning_effort": "maximal"}, "reasoning_effort"),
        ({"verbosity": "loud"}, "verbosity"),
        ({"prompt_cache_key": 3}, "prompt_cache_key"),
        ({"prompt_cache_retention": "forever"}, "prompt_cache_retention"),
        ({"prediction": {"type": "diff", "content": "x"}}, "prediction.type"),
        ({"cache_prompt": "yes"}, "cache_prompt"),
        ({"n_predict": 0}, "n_predict"),
        ({"n_predict": 2.5}, "n_predict"),
        ({"id_slot": -2}, "id_slot"),
    ],
)
def test_the_options_frameworks_send_are_refused_when_wrong(fields, param):
    with pytest.raises(ApiError) as caught:
        parse_body(body(**fields), ChatRequest)
    assert caught.value.status == 400 and caught.value.param == param, caught.value


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"truncation": "sometimes"}, "truncation"),
        ({"max_tool_calls": -1}, "max_tool_calls"),
        ({"text": {"verbosity": "loud"}}, "text.verbosity"),
        ({"reasoning": {"effort": "maximal"}}, "reasoning.effort"),
    ],
)
def test_responses_options_are_refused_when_wrong(fields, param):
    with pytest.raises(ApiError) as caught:
        raw = json.dumps({"input": "hi", **fields}).encode()
        parse_body(raw, ResponsesRequest, unsupported=RESPONSES_UNSUPPORTED, ignored=RESPONSES_IGNORED)
    assert caught.value.status == 400 and caught.value.param == param, caught.value


# A byte-level vocabulary: a grammar's mask read character by character (issue 63 item 9).
BYTES = GrammarVocab([bytes([i]) for i in range(256)] + [b"\xff<end>"], [256], lambda text: list(text.encode()))
CITY = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}}}


def _allows_after(grammar, text: str, char: str) -> bool:
    constraint = BYTES.compile(grammar).start()
    for byte in text.encode():
        assert constraint.push(byte), text
    return constraint.mask().allows(ord(char))


def _grammars(schema: dict) -> list:
    """The grammar each route builds from `schema` as its structured-output format."""
    chat = parse_body(body(response_format={"type": "json_schema", "json_schema": {"schema": schema}}), ChatRequest)
    text = {"format": {"type": "json_schema", "name": "x", "schema": schema}}
    responses = parse_body(json.dumps({"input": "hi", "text": text}).encode(), ResponsesRequest)
    claude = {"max_tokens": 9, "messages": HI, "output_config": {"format": {"type": "json_schema", "schema": schema}}}
    messages = parse_body(json.dumps(claude).encode(), MessagesRequest, unsupported={}, ignored=())
    return [chat.grammar, responses.grammar(), messages.grammar()]


def test_a_schemas_objects_that_do_not_say_additional_properties_are_closed():
    """Before: after "country" a model could go on with a key of its own ("location")."""
    nested = {"type": "object", "properties": {"place": CITY}, "required": ["place"]}
    for grammar in _grammars(nested):
        assert not _allows_after(grammar, '{"place":{"city":"Paris","country":"France"', ",")
        assert _allows_after(grammar, '{"place":{"city":"Paris","country":"France"', "}")
    for grammar in _grammars({**CITY, "additionalProperties": True}):  # a schema that says so stays open
        assert _allows_after(grammar, '{"city":"Paris","country":"France"', ",")
    assert _allows_after(_grammars({})[0], "{", '"')  # an empty schema is any JSON still


def test_a_prompt_with_no_room_in_the_pool_is_a_503_in_one_line():
    """The slots' shared pool with no room for a prompt and nothing running to free it (`NoRoomError` from a prompt's
    read; one beside running requests waits for them: tests/server/test_scheduler.py): the server's state, not the
    request's fault — 503 `kv_full`, saying what to change, streamed or not."""
    from localspec.errors import NoRoomError
    from localspec.server.flow import _as_api

    why = "the slots' shared KV pool is full (4096 cells for 4 slots): raise --n-ctx or lower --parallel"
    error = _as_api(NoRoomError(why))
    assert (error.status, error.type, error.code) == (503, "server_error", "kv_full")
    assert error.message == f"the prompt finds no room in the slots' shared KV pool: {why}"
    assert "\n" not in error.message
