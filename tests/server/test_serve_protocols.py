"""Every client's protocol on the tiny pair (issue 47): Anthropic's Messages, OpenAI's Responses and embeddings, each
a translation onto the chat route's request model — so greedy answers are the same on the three chat routes, the
speculation stats ride on each — and each route's bad input answered in its own error shape, naming the field, the
server serving on. Embeddings are checked against llama-cpp-python's own high-level `Llama(embedding=True)`.
"""

from __future__ import annotations

import base64
import http.client
import json

import anthropic
import numpy as np
import pytest
from support.server import anthropic_error_of, error_of, raw, start_server, write_home

from localspec.core.params import DEFAULT_MODEL_DRAFTER

SYSTEM = "You are terse."
USER = "the man said that the water was hot and"


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    home = write_home(
        tmp_path_factory.mktemp("protocols-home"), tiny_models.target, tiny_models.draft_noisy, tiny_models.draft_same
    )
    running = start_server(home, "--pair", "tiny", "--queue", "2")
    yield running
    assert running.stop() == 143, running.stderr()
    assert "Traceback" not in running.stderr() and "Traceback" not in running.log()


def anthropic_client(server, **kwargs):
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="none", max_retries=0, **kwargs)


def test_greedy_answers_are_equal_across_the_three_chat_routes(server):
    chat = server.client().chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
        max_tokens=24,
        temperature=0,
    )
    message = anthropic_client(server).messages.create(
        model="tiny", system=SYSTEM, messages=[{"role": "user", "content": USER}], max_tokens=24
    )
    response = server.client().responses.create(
        model="tiny", instructions=SYSTEM, input=USER, max_output_tokens=24, temperature=0
    )
    text = chat.choices[0].message.content
    assert text and message.content[0].text == text and response.output_text == text
    assert message.stop_reason == "max_tokens" and response.status == "incomplete"
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert response.usage.input_tokens == chat.usage.prompt_tokens and response.usage.output_tokens == 24


def test_the_speculation_stats_ride_on_every_route(server):
    """The noisy draft drafts: `timings.draft_n` and the `localspec` stats in each route's own object."""
    fixed = {"adaptive": False}  # the noisy draft drafts on (the adaptive policy may have stopped it by now)
    message = anthropic_client(server).messages.create(model="tiny", messages=[{"role": "user", "content": USER}],
                                                       max_tokens=16, extra_body=fixed)  # fmt: skip
    response = server.client().responses.create(model="tiny", input=USER, max_output_tokens=16, extra_body=fixed)
    for extra in (message.model_extra, response.model_extra):
        assert extra["timings"]["draft_n"] > 0 and extra["timings"]["predicted_n"] == 16
        assert extra["localspec"]["drafter"] == DEFAULT_MODEL_DRAFTER and extra["localspec"]["target_passes"] > 0
    with anthropic_client(server).messages.stream(
        model="tiny", messages=[{"role": "user", "content": USER}], max_tokens=16
    ) as stream:
        deltas = [e for e in stream if e.type == "message_delta"]
    stats = deltas[-1].model_extra  # the adaptive policy may have stopped drafting by now: the stats are there
    assert stats["timings"]["predicted_n"] == 16 and stats["localspec"]["target_passes"] > 0
    events = list(server.client().responses.create(model="tiny", input=USER, max_output_tokens=16, stream=True))
    assert events[-1].response.model_extra["localspec"]["target_passes"] > 0


def test_the_anthropic_stream_has_its_event_sequence_and_equals_the_whole_answer(server):
    ask = dict(model="tiny", messages=[{"role": "user", "content": USER}], max_tokens=12, stop_sequences=["zzz"])
    whole = anthropic_client(server).messages.create(**ask)
    with anthropic_client(server).messages.stream(**ask) as stream:
        final = stream.get_final_message()
    _, _, body = raw(server.port, "POST", "/v1/messages", {**ask, "stream": True})
    kinds = [line[len("event: ") :] for line in body.decode().splitlines() if line.startswith("event: ")]
    assert kinds[:4] == ["message_start", "ping", "content_block_start", "content_block_delta"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason


@pytest.mark.slow
def test_a_stop_sequence_is_named_in_the_stop_reason(server):
    first = anthropic_client(server).messages.create(model="tiny", messages=[{"role": "user", "content": USER}],
                                                     max_tokens=12)  # fmt: skip
    word = first.content[0].text.split()[2]
    stopped = anthropic_client(server).messages.create(
        model="tiny", messages=[{"role": "user", "content": USER}], max_tokens=12, stop_sequences=[word]
    )
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    assert word not in stopped.content[0].text


def test_count_tokens_counts_the_prompt_messages_would_send(server):
    client = anthropic_client(server)
    ask = dict(model="tiny", system=SYSTEM, messages=[{"role": "user", "content": USER}])
    counted = client.messages.count_tokens(**ask)
    answered = client.messages.create(**ask, max_tokens=1)
    assert counted.input_tokens == answered.usage.input_tokens + answered.usage.cache_read_input_tokens > 5


@pytest.mark.slow
def test_x_api_key_is_accepted_like_the_bearer_token(tiny_models, tmp_path):
    home = write_home(tmp_path / "home", tiny_models.target, tiny_models.draft_noisy, tiny_models.draft_same)
    keyed = start_server(home, "--pair", "tiny", "--api-key", "sesame")
    try:
        good = anthropic.Anthropic(base_url=f"http://127.0.0.1:{keyed.port}", api_key="sesame", max_retries=0)
        assert good.messages.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2).content
        assert keyed.client(api_key="sesame").responses.create(model="tiny", input="hi", max_output_tokens=2).id
        bad = anthropic.Anthropic(base_url=f"http://127.0.0.1:{keyed.port}", api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as e:
            bad.messages.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert e.value.body == {"type": "error", "error": {"type": "authentication_error", "message": e.value.body[
            "error"]["message"]}} and "x-api-key" in e.value.body["error"]["message"]  # fmt: skip
        status, _, body = raw(keyed.port, "POST", "/v1/responses", {"input": "hi"}, headers={"x-api-key": "wrong"})
        assert status == 401 and error_of(body)["code"] == "invalid_api_key"
    finally:
        keyed.stop()


USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.mark.parametrize(
    "body,status,field",
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "max_tokens"),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]}]},
            400,
            "tool_use_id",
        ),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            400,
            "messages.0.content.0.type",
        ),  # fmt: skip
        ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "colour": 1}, 400, "colour"),
        (
            {
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [TOOL],
                "tool_choice": {"type": "tool", "name": "nope"},
            },
            400,
            "tool_choice.name",
        ),  # fmt: skip
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [USE]}]},
            400,
            "messages",
        ),  # fmt: skip
        ({"max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}, 400, "max_tokens"),
        ({"max_tokens": 4, "messages": []}, 400, "messages"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "model": "nope"}, 404, "model"),
    ],
)
def test_messages_bad_input_is_anthropics_error_naming_the_field(server, body, status, field):
    got, _, reply = raw(server.port, "POST", "/v1/messages", body)
    error = anthropic_error_of(reply)
    assert got == status and field in error["message"], error
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert server.healthy()


def test_messages_transport_errors_are_anthropics_shape_too(server):
    got, _, reply = raw(server.port, "POST", "/v1/messages", "{not json")
    assert got == 400 and "JSON" in anthropic_error_of(reply)["message"]
    got, _, reply = raw(server.port, "POST", "/v1/messages", b"{}", content_type="text/plain")
    assert got == 415 and anthropic_error_of(reply)["type"] == "invalid_request_error"
    got, _, reply = raw(server.port, "POST", "/v1/messages/count_tokens", {"messages": []})
    assert got == 400 and "messages" in anthropic_error_of(reply)["message"]


@pytest.mark.parametrize(
    "body,status,param",
    [
        ({"input": [{"type": "image_generation_call", "id": "x"}]}, 400, "input.0.type"),
        ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]}, 400, "input.0.call_id"),
        ({"input": "hi", "previous_response_id": "resp_missing"}, 400, "previous_response_id"),
        ({"input": []}, 400, "input"),
        ({"input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens"),
        ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "text.format.schema"),
        ({"input": "hi", "background": True}, 400, "background"),
        ({"input": [{"role": "user", "content": "hi", "colour": 1}]}, 400, "input.0.colour"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "x"}]}]},
            400,
            "input.0.content.0.type",
        ),  # fmt: skip
    ],
)
def test_responses_bad_input_names_the_field(server, body, status, param):
    got, _, reply = raw(server.port, "POST", "/v1/responses", body)
    assert got == status and error_of(reply)["param"] == param, reply
    assert server.healthy()


def test_an_answer_cut_by_max_output_tokens_says_incomplete_in_its_message_item_too(server):
    """Before: `status: incomplete` on the response, `completed` on its message item (issue 63 item 10)."""
    client = server.client()
    cut = client.responses.create(model="tiny", input=USER, max_output_tokens=6)
    assert cut.status == "incomplete" and [item.status for item in cut.output] == ["incomplete"]
    events = list(client.responses.create(model="tiny", input=USER, max_output_tokens=6, stream=True))
    done = [e.item.status for e in events if e.type == "response.output_item.done"]
    assert done == ["incomplete"] and events[-1].type == "response.incomplete"
    assert [item.status for item in events[-1].response.output] == ["incomplete"]
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}  # closed: it ends
    text = {"format": {"type": "json_schema", "name": "a", "schema": schema}}
    whole = client.responses.create(model="tiny", input=USER, max_output_tokens=20, text=text)
    assert whole.status == "completed" and {item.status for item in whole.output} == {"completed"}


def test_the_options_frameworks_send_are_accepted_on_chat_and_responses(server):
    """What openai-agents, pydantic-ai, litellm and llama-server's own clients send when a user sets it (issue 63 item
    8): accepted, and the answer is the one without them; llama-server's `n_predict` is max_tokens."""
    client = server.client()
    plain = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": USER}], max_tokens=6)
    asked = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": USER}],
        reasoning_effort="low",  # the tiny model does not think: a light effort asks nothing of it
        verbosity="low",
        prompt_cache_key="user-42",
        safety_identifier="someone",
        prompt_cache_retention="24h",
        prediction={"type": "content", "content": "the man said"},
        extra_body={"cache_prompt": False, "n_predict": 6, "id_slot": 0},
    )
    assert asked.choices[0].message.content == plain.choices[0].message.content
    assert asked.usage.completion_tokens == 6
    response = client.responses.create(
        model="tiny",
        input=USER,
        max_output_tokens=6,
        truncation="auto",
        max_tool_calls=2,
        text={"verbosity": "low"},
        prompt_cache_retention="in_memory",
        reasoning={"effort": "minimal"},
    )
    assert response.output_text == plain.choices[0].message.content and response.truncation == "auto"


def test_a_response_stored_with_store_false_cannot_be_continued(server):
    client = server.client()
    kept = client.responses.create(model="tiny", input=USER, max_output_tokens=4)
    assert client.responses.retrieve(kept.id).output_text == kept.output_text
    gone = client.responses.create(model="tiny", input=USER, max_output_tokens=4, store=False)
    status, _, body = raw(server.port, "POST", "/v1/responses", {"input": "and?", "previous_response_id": gone.id})
    assert status == 400 and error_of(body)["param"] == "previous_response_id"
    assert raw(server.port, "GET", f"/v1/responses/{gone.id}")[0] == 404
    follow = client.responses.create(model="tiny", input="and?", previous_response_id=kept.id, max_output_tokens=4)
    assert follow.usage.input_tokens > kept.usage.input_tokens + kept.usage.output_tokens
    assert client.responses.delete(kept.id) is None and raw(server.port, "GET", f"/v1/responses/{kept.id}")[0] == 404


def test_a_client_that_leaves_a_stream_cancels_it_and_the_stored_response_says_so(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = json.dumps({"input": USER, "max_output_tokens": 1500, "stream": True})
    conn.request("POST", "/v1/responses", body=body, headers={"Content-Type": "application/json"})
    stream = conn.getresponse()
    first = b""
    while b"\n\n" not in first:
        first += stream.read1(4096)
    response_id = json.loads(first.split(b"data: ", 1)[1].split(b"\n")[0])["response"]["id"]
    path = f"/v1/responses/{response_id}"
    stream.read1(4096)  # a delta or two
    conn.sock.close()
    conn.close()
    server.wait_until(lambda: raw(server.port, "GET", path)[0] == 200, f"the response stored at {path}")
    stored = raw(server.port, "GET", path)[2]
    assert json.loads(stored)["status"] == "cancelled"
    assert server.healthy() and server.client().responses.create(model="tiny", input="hi", max_output_tokens=2).id


@pytest.mark.parametrize(
    "body,status,param",
    [
        ({"input": ""}, 400, "input"),
        ({"input": []}, 400, "input"),
        ({"input": ["a", ""]}, 400, "input.1"),
        ({"input": [[1, 2], []]}, 400, "input.1"),
        ({"input": "a", "dimensions": 3}, 400, "dimensions"),
        ({"input": [1, 2, 10**9]}, 400, "input.0"),
        ({"input": "a", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"input": "a", "model": "nope"}, 404, "model"),
    ],
)
def test_embeddings_bad_input_names_the_field(server, body, status, param):
    got, _, reply = raw(server.port, "POST", "/v1/embeddings", body)
    assert got == status and error_of(reply)["param"] == param, reply
    assert server.healthy()


def test_a_10_mb_embeddings_input_is_refused_before_the_engine(server):
    got, _, reply = raw(server.port, "POST", "/v1/embeddings", {"input": "the " * (10 * 2**20 // 4)})
    assert got == 413 and error_of(reply)["code"] == "body_too_large" and server.healthy()


TEXTS = ["the man said that the water was hot", "a cat", "the quick brown fox jumps over the lazy dog"]


def test_embeddings_shape_base64_and_llama_cpp_pythons_own(server, tiny_models):
    import llama_cpp

    client = server.client()
    floats = client.embeddings.create(model="tiny", input=TEXTS, encoding_format="float")
    encoded = client.embeddings.create(model="tiny", input=TEXTS, encoding_format="base64")
    assert [d.index for d in floats.data] == [0, 1, 2] and floats.model == "tiny"
    vectors = np.array([d.embedding for d in floats.data])
    assert vectors.shape == (3, 64) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    decoded = np.array([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in encoded.data])
    assert np.array_equal(decoded, vectors.astype(np.float32))
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > len(TEXTS)
    tokens = client.embeddings.create(model="tiny", input=[[1, 2, 3], [4, 5]], encoding_format="float")
    assert len(tokens.data) == 2 and tokens.usage.prompt_tokens == 5
    reference = llama_cpp.Llama(
        str(tiny_models.target), embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, n_ctx=512,
        verbose=False,
    )  # fmt: skip
    try:
        for text, vector in zip(TEXTS, vectors):
            theirs = np.array(reference.embed(text))
            cosine = float(theirs @ vector / np.linalg.norm(theirs) / np.linalg.norm(vector))
            assert cosine >= 1 - 1e-4, (text, cosine)
        different = np.array(reference.embed("something else entirely"))
        cosine = float(different @ vectors[1] / np.linalg.norm(different))
        assert cosine < 1 - 1e-3  # the check can fail: other text, another vector
    finally:
        reference.close()
