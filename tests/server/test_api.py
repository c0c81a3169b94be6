"""`server.api`: request bodies read strictly, in-process — every body is a request or a 400 naming what is wrong,
never another exception; unsupported fields are refused by name unless their value changes nothing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.server.api import UNSUPPORTED, ApiError, ChatRequest, CompletionRequest, parse_body

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
