"""`localspec serve` end to end: a real uvicorn subprocess on the tiny pair, driven by the real `openai` client.

One server per module (the tiny models load in a second); each test leaves it healthy for the next. Greedy answers
over HTTP are compared with `localspec generate --chat` on the same messages, streaming with the whole answer,
speculation with plain decoding; the error matrix checks the status, OpenAI's error object and the server's health
after each case, and at the end that no traceback reached its stderr or its log.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time

import openai
import pytest
from support.server import WAIT, error_of, raw, start_server, write_home

from localspec.cli.main import main

SYSTEM = "You are terse."
USER = "the man said that the water was hot and"
BIG = "the " * 3000  # more tokens than the 2048-token context
CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    home = write_home(
        tmp_path_factory.mktemp("serve-home"), tiny_models.target, tiny_models.draft_noisy, tiny_models.draft_same
    )
    # one slot: the queue's tests need requests that wait (the default, --parallel auto, runs four at once)
    running = start_server(home, "--pair", "tiny", "--queue", "2", "--parallel", "1")
    yield running
    code = running.stop()  # SIGTERM: 143, as `generate` exits on it
    assert code == 143, running.stderr()
    assert "Traceback" not in running.stderr() and "Traceback" not in running.log()


@pytest.fixture
def client(server):
    return server.client()


def chat(client, messages=None, **kwargs):
    messages = messages or [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    kwargs.setdefault("temperature", 0)
    return client.chat.completions.create(model="tiny", messages=messages, **kwargs)


@pytest.mark.slow
def test_greedy_chat_equals_generate_chat(client, server, monkeypatch, capsys):
    response = chat(client, max_tokens=32)
    monkeypatch.setenv("LOCALSPEC_HOME", str(server.home))
    code = main(["generate", USER, "--chat", "--system", SYSTEM, "--pair", "tiny", "--temperature", "0",
                 "--max-tokens", "32", "--json"])  # fmt: skip
    assert code == 0
    [line] = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    [choice] = response.choices
    assert choice.message.content == line["text"] and choice.message.role == "assistant"
    assert choice.finish_reason == line["finish_reason"]
    assert response.usage.prompt_tokens == line["prompt_tokens"]
    assert response.usage.completion_tokens == len(line["tokens"])
    assert response.model == "tiny" and response.object == "chat.completion"


def test_a_conversation_goes_on_with_the_clients_own_message_object(client):
    """The openai client's usual pattern: append `choices[0].message` (as the object, and as `model_dump()`, which
    has every field of the schema) and send the next turn, a `name` on it."""
    from openai.types.chat import ChatCompletionMessage

    messages: list = [{"role": "user", "content": USER}]
    first = chat(client, messages, max_tokens=6).choices[0].message
    follow_up = {"role": "user", "content": "and then?", "name": "bob"}
    second = chat(client, [*messages, first, follow_up], max_tokens=6)
    dumped = first.model_dump()
    assert set(dumped) == set(ChatCompletionMessage.model_fields)  # every field the schema has, None where unset
    third = chat(client, [*messages, dumped, follow_up], max_tokens=6)
    assert second.choices[0].message.content == third.choices[0].message.content  # the echoed fields change nothing
    for name in set(dumped) - {"role", "content", "tool_calls"}:  # each unsupported field at a value that would
        with pytest.raises(openai.BadRequestError) as refused:  # change the answer
            chat(client, [*messages, {**dumped, name: {"x": 1}}, follow_up], max_tokens=6)
        assert refused.value.body["param"] == f"messages.1.{name}", name
        assert refused.value.body["code"] == "unsupported_parameter"
    with pytest.raises(openai.BadRequestError) as refused:  # tool calls are read (docs/serve.md "Tools"): typed
        chat(client, [*messages, {**dumped, "tool_calls": {"x": 1}}, follow_up], max_tokens=6)
    assert refused.value.body["param"] == "messages.1.tool_calls"


def test_streamed_chunks_concatenate_to_the_whole_answer(client):
    whole = chat(client, max_tokens=40).choices[0].message.content
    chunks = list(chat(client, max_tokens=40, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    *_, last_choice, usage_chunk = chunks
    assert last_choice.choices[0].finish_reason == "length"
    assert last_choice.model_extra["timings"]["predicted_n"] == 40  # the last chunk carries the timings
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == 40
    assert usage_chunk.model_extra["timings"]["draft_n_accepted"] <= usage_chunk.model_extra["timings"]["draft_n"]
    no_usage = list(chat(client, max_tokens=8, stream=True))
    assert all(c.usage is None for c in no_usage) and no_usage[-1].choices[0].finish_reason


def test_text_completions_stream_and_not(client):
    whole = client.completions.create(model="tiny", prompt=USER, max_tokens=24, temperature=0)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    streamed = client.completions.create(model="tiny", prompt=USER, max_tokens=24, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text


def test_n_choices_are_independent_draws(client):
    fixed = {"draft_max": 4, "adaptive": False}  # the adaptive policy learns across requests: k would differ
    response = chat(client, max_tokens=12, n=3, temperature=1.0, seed=11, extra_body=fixed)
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert len({c.message.content for c in response.choices}) > 1
    assert response.usage.completion_tokens == 36
    again = chat(client, max_tokens=12, n=3, temperature=1.0, seed=11, extra_body=fixed)
    assert [c.message.content for c in again.choices] == [c.message.content for c in response.choices]  # same seed


def test_stop_strings_end_the_answer_before_them(client):
    full = chat(client, max_tokens=40).choices[0].message.content
    words = full.split()
    stop = words[len(words) // 2]
    cut = full[: full.index(stop)]
    for given in (stop, [stop, "never appears here"]):
        [choice] = chat(client, max_tokens=40, stop=given).choices
        assert choice.message.content == cut and choice.finish_reason == "stop"


def test_draft_max_0_and_8_give_the_same_greedy_text(client):
    plain = chat(client, max_tokens=48, extra_body={"draft_max": 0})
    spec = chat(client, max_tokens=48, extra_body={"draft_max": 8, "adaptive": False})
    assert spec.choices[0].message.content == plain.choices[0].message.content
    assert plain.model_extra["timings"]["draft_n"] == 0
    assert spec.model_extra["timings"]["draft_n"] > 0
    none = chat(client, max_tokens=48, extra_body={"drafter": "none"})
    assert none.model_extra["timings"]["draft_n"] == 0
    assert none.choices[0].message.content == plain.choices[0].message.content


def test_a_request_picks_its_drafter_and_the_next_gets_the_servers_again(client):
    reference = chat(client, max_tokens=40, extra_body={"draft_max": 0}).choices[0].message.content
    for drafter in ("ngram", "model+ngram", "none", "model"):
        answer = chat(client, max_tokens=40, extra_body={"drafter": drafter, "draft_max": 4, "adaptive": False})
        assert answer.choices[0].message.content == reference, drafter
        if drafter == "none":
            assert answer.model_extra["timings"]["draft_n"] == 0
    after = chat(client, max_tokens=40, extra_body={"draft_max": 4, "adaptive": False})
    assert after.model_extra["timings"]["draft_n"] > 0  # the model drafter again


def test_usage_and_timings_are_consistent(client):
    response = chat(client, max_tokens=30, extra_body={"draft_max": 4, "adaptive": False})
    usage, timings, ours = response.usage, response.model_extra["timings"], response.model_extra["localspec"]
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert timings["predicted_n"] == usage.completion_tokens == 30
    assert timings["prompt_n"] + timings["cache_n"] == usage.prompt_tokens
    assert 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    assert timings["predicted_per_second"] > 0
    assert ours["acceptance_rate"] == pytest.approx(timings["draft_n_accepted"] / timings["draft_n"])
    assert ours["tokens_per_target_pass"] == pytest.approx(30 / ours["target_passes"], rel=0.2)
    assert {"alpha", "decision", "draft_length", "speculation_off", "prompt_reused"} <= set(ours)


def test_a_follow_up_turn_decodes_only_the_new_tokens(client):
    first_turn = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER + " " + "long " * 300}]
    first = chat(client, first_turn, max_tokens=24)
    answer = first.choices[0].message.content
    second_turn = first_turn + [{"role": "assistant", "content": answer}, {"role": "user", "content": "and then?"}]
    second = chat(client, second_turn, max_tokens=8)
    timings = second.model_extra["timings"]
    # The whole first prompt stays in the cache; the random tiny model's answer may re-tokenize differently.
    assert timings["cache_n"] >= first.usage.prompt_tokens - 1, timings
    assert timings["cache_n"] >= 0.9 * second.usage.prompt_tokens, timings
    assert second.model_extra["localspec"]["prompt_reused"] >= 0.9


def test_a_client_that_leaves_mid_stream_stops_its_generation(client, server):
    stream = chat(client, max_tokens=1500, n=8, stream=True)
    for _, chunk in zip(range(3), stream):
        assert chunk.choices
    stream.close()
    server.wait_until(lambda: "cancelled after" in server.stderr(), "the server to cancel the stream")
    assert chat(client, max_tokens=8).choices[0].finish_reason == "length"  # the next request is answered


def test_a_client_that_leaves_before_a_whole_answer_stops_it_too(server):
    stopped = ("cancelled after", "cancelled before it began")  # the client may leave before the first choice began

    def count() -> int:
        return sum(server.stderr().count(s) for s in stopped)

    cancelled = count()
    body = json.dumps({"model": "tiny", "messages": HI, "max_tokens": 1500, "n": 8, "temperature": 0})
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(
            f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
        )
        server.wait_until(lambda: json.loads(raw(server.port, "GET", "/health")[2])["queue"] >= 1, "the request")
    server.wait_until(lambda: count() > cancelled, "the server to cancel the request")
    assert "the client went away; its request is cancelled" in server.stderr()
    assert chat(server.client(), max_tokens=4).choices[0].finish_reason == "length"


HUGE = [
    ("many", {"messages": [{"role": "user", "content": "x"}] * 100_000}, "the messages are 100000 messages but"),
    ("long", {"messages": [{"role": "user", "content": "the water " * 100_000}] * 3}, "the conversation is at least"),
    ("prompt", {"prompt": "the water " * 350_000}, "the prompt is at least"),
]


@pytest.mark.parametrize(("body", "message"), [h[1:] for h in HUGE], ids=[h[0] for h in HUGE])
def test_a_huge_body_is_refused_before_tokenizing_and_holds_no_one_up(server, record_property, body, message):
    """3–3.5 MB (under the body limit): 100,000 one-character messages, three of a megabyte, one prompt of 3.5 MB —
    each refused as too long for the context from its length alone, while another client is answered."""
    path = CHAT if "messages" in body else "/v1/completions"
    many = {"model": "tiny", "max_tokens": 4, **body}
    answers: dict[str, tuple[int, bytes]] = {}

    def send(name: str, path: str, body: dict) -> None:
        status, _, data = raw(server.port, "POST", path, body)
        answers[name] = (status, data)

    started = time.monotonic()
    big = threading.Thread(target=send, args=("big", path, many))
    big.start()
    send("small", CHAT, {"model": "tiny", "messages": HI, "max_tokens": 4, "temperature": 0})
    big.join(120)
    record_property("seconds_for_both", round(time.monotonic() - started, 2))
    assert answers["small"][0] == 200, answers["small"]
    status, data = answers["big"]
    error = error_of(data)
    assert status == 400 and error["code"] == "context_length_exceeded", error
    assert error["param"] == ("messages" if path == CHAT else "prompt") and error["message"].startswith(message), error


def test_two_clients_at_once_are_answered_in_order(server):
    """One slot: a request that comes while another is answered waits for it. What the server guarantees is the
    order it answers in, so that is what is checked, not this process's clocks: both sockets are read by one thread,
    and when the second answer's first byte is there, the first stream's end must be there already (the server
    wrote it before it began the second), however late this process runs."""
    first = _send(server.port, {"model": "tiny", "messages": HI, "max_tokens": 300, "n": 4, "temperature": 0.8,
                                "seed": 1, "stream": True})  # fmt: skip
    got = {first: _read_some(first)}  # its head and first event: it is being answered
    second = _send(server.port, {"model": "tiny", "messages": HI, "max_tokens": 10, "n": 4, "temperature": 0.8,
                                 "seed": 1})  # fmt: skip
    got[second] = b""
    reading = [first, second]
    while not _whole(got[second]):
        readable, _, _ = select.select(reading, [], [], WAIT)
        assert readable, f"neither answer moved in {WAIT:g} s"
        if second in readable and not got[second]:
            got[first] += _drain(first)  # all the first's bytes written before the second's first one
            assert b"data: [DONE]" in got[first], "the second request was answered before the first had ended"
        for sock in readable:
            more = sock.recv(65536)
            got[sock] += more
            if not more:  # closed: the whole answer is in
                reading.remove(sock)
    first.close()
    second.close()
    assert b"data: [DONE]" in got[first]
    assert got[second].startswith(b"HTTP/1.1 200") and json.loads(got[second].split(b"\r\n\r\n", 1)[1])["choices"]


def _send(port: int, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    sock.sendall(
        f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def _read_some(sock: socket.socket) -> bytes:
    """What the server sent, up to its first server-sent event."""
    got = b""
    while b"data: " not in got:
        more = sock.recv(65536)
        assert more, got
        got += more
    return got


def _drain(sock: socket.socket) -> bytes:
    """What `sock` has received and not yet read, without waiting for more."""
    got = b""
    sock.setblocking(False)
    try:
        while more := sock.recv(65536):
            got += more
    except BlockingIOError:
        pass
    finally:
        sock.setblocking(True)
    return got


def _whole(response: bytes) -> bool:
    """Whether a response with a Content-Length has come whole."""
    head, sep, body = response.partition(b"\r\n\r\n")
    if not sep:
        return False
    length = [line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
    return bool(length) and len(body) >= int(length[0])


def test_past_the_queue_bound_a_503_with_retry_after(client, server):
    stream = chat(client, max_tokens=1500, n=8, stream=True)  # running
    next(iter(stream))
    waiting = threading.Thread(target=lambda: chat(server.client(), max_tokens=4))
    waiting.start()
    server.wait_until(lambda: json.loads(raw(server.port, "GET", "/health")[2])["queue"] >= 2, "a queue of 2")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    status, headers, data = raw(server.port, "POST", "/v1/chat/completions", body)
    assert status == 503 and headers["retry-after"] == "1"
    assert error_of(data)["code"] == "queue_full"
    stream.close()
    waiting.join(60)
    assert server.healthy()


def test_models_lists_the_loaded_pair_first_and_a_request_switches_pairs(client, server):
    assert [m.id for m in client.models.list()][:1] == ["tiny"]
    assert client.models.retrieve("tiny-same").id == "tiny-same"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    assert "tiny-same" in [m.id for m in client.models.list()]
    other = client.chat.completions.create(
        model="tiny-same", messages=[{"role": "user", "content": USER}], max_tokens=8, temperature=0
    )
    assert other.model == "tiny-same" and "loading tiny-same" in server.stderr()
    assert [m.id for m in client.models.list()][0] == "tiny-same"
    back = chat(client, max_tokens=8)
    assert back.model == "tiny" and [m.id for m in client.models.list()][0] == "tiny"


ERRORS = [
    # (name, path, body, extra request arguments, status, param, code)
    ("bad JSON", CHAT, b"{bad", {}, 400, None, "invalid_json"),
    ("not an object", CHAT, b"[1, 2]", {}, 400, None, "invalid_json"),
    ("NaN", CHAT, b'{"messages": [], "temperature": NaN}', {}, 400, None, "invalid_json"),
    ("not UTF-8", CHAT, b'{"messages": "\xff"}', {}, 400, None, "invalid_json"),
    ("no messages", CHAT, {"model": "tiny"}, {}, 400, "messages", "missing_required_parameter"),
    ("empty messages", CHAT, {"messages": []}, {}, 400, "messages", "invalid_value"),
    ("a wrong role", CHAT, {"messages": [{"role": "robot", "content": "x"}]}, {}, 400, "messages.0.role", None),
    ("a wrong type", CHAT, {"messages": HI, "temperature": "hot"}, {}, 400, "temperature", "invalid_value"),
    ("a float for an int", CHAT, {"messages": HI, "max_tokens": 2.5}, {}, 400, "max_tokens", "invalid_value"),
    ("out of range", CHAT, {"messages": HI, "top_p": 0}, {}, 400, "top_p", "invalid_value"),
    ("n of 0", CHAT, {"messages": HI, "n": 0}, {}, 400, "n", "invalid_value"),
    ("an empty stop", CHAT, {"messages": HI, "stop": [""]}, {}, 400, "stop", "invalid_value"),
    ("unknown field", CHAT, {"messages": HI, "frobnicate": 1}, {}, 400, "frobnicate", "unsupported_parameter"),
    ("functions", CHAT, {"messages": HI, "functions": [{"name": "f"}]}, {}, 400, "functions", "unsupported_parameter"),
    ("top_logprobs", CHAT, {"messages": HI, "logprobs": True, "top_logprobs": 21}, {}, 400, "top_logprobs", None),
    (
        "a tool without a function",
        CHAT,
        {"messages": HI, "tools": [{"type": "function"}]},
        {},
        400,
        "tools.0.function",
        None,
    ),
    (
        "response_format",
        CHAT,
        {"messages": HI, "response_format": {"type": "yaml"}},
        {},
        400,
        "response_format.type",
        "invalid_value",
    ),
    ("an unknown drafter", CHAT, {"messages": HI, "drafter": "magic"}, {}, 400, "drafter", "invalid_value"),
    (
        "mtp on a target without a head",
        CHAT,
        {"messages": HI, "drafter": "mtp"},
        {},
        400,
        "drafter",
        "unsupported_value",
    ),
    ("unknown model", CHAT, {"model": "nope", "messages": HI}, {}, 404, "model", "model_not_found"),
    ("a lone surrogate in a name", CHAT, {"model": "\udcff", "messages": HI}, {}, 400, None, "invalid_json"),
    ("a lone surrogate as a field", CHAT, {"messages": HI, "\udcff": 1}, {}, 400, None, "invalid_json"),
    (
        "max_tokens past the context",
        CHAT,
        {"messages": HI, "max_tokens": 100_000},
        {},
        400,
        "max_tokens",
        "context_length_exceeded",
    ),  # fmt: skip
    ("a prompt past the context", "/v1/completions", {"prompt": BIG}, {}, 400, "prompt", "context_length_exceeded"),
    ("a list of prompts", "/v1/completions", {"prompt": ["a", "b"]}, {}, 400, "prompt", "invalid_value"),
    ("text/plain", CHAT, {"messages": HI}, {"content_type": "text/plain"}, 415, None, "unsupported_media_type"),
    ("form", CHAT, "a=b", {"content_type": "application/x-www-form-urlencoded"}, 415, None, "unsupported_media_type"),
    ("too large", CHAT, b" " * (5 * 2**20), {}, 413, None, "body_too_large"),
    ("a foreign Host", CHAT, {"messages": HI}, {"headers": {"Host": "evil.example:80"}}, 403, None, "forbidden_host"),
    ("a foreign Host on GET", "/v1/models", None, {"headers": {"Host": "attacker.test"}}, 403, None, "forbidden_host"),
    ("an unknown route", "/v1/audio/speech", {"input": "x"}, {}, 404, None, "not_found"),  # embeddings exist now
]


@pytest.mark.parametrize(
    ("name", "path", "body", "extra", "status", "param", "code"), ERRORS, ids=[e[0] for e in ERRORS]
)
def test_the_error_matrix(server, name, path, body, extra, status, param, code):
    method = "GET" if body is None else "POST"
    got, _, data = raw(server.port, method, path, body, **extra)
    assert got == status, data
    error = error_of(data)
    assert error["param"] == param and (code is None or error["code"] == code), error
    assert server.healthy()


@pytest.mark.parametrize(
    ("body", "path", "message"),
    [
        ({"messages": [{"role": "user", "content": BIG}]}, CHAT, "the messages are "),
        ({"prompt": BIG}, "/v1/completions", "the prompt is "),
        ({"messages": HI, "stop": ["x"] * 17}, CHAT, "'stop': at most 16 stop strings, not 17"),
    ],
    ids=["messages", "prompt", "stop"],
)
def test_errors_say_what_is_wrong_in_plain_words(server, body, path, message):
    status, _, data = raw(server.port, "POST", path, body)
    assert status == 400 and error_of(data)["message"].startswith(message), data


def test_get_on_a_post_route_is_405_and_the_openai_client_sees_the_errors(client, server):
    status, _, data = raw(server.port, "GET", CHAT)
    assert status == 405 and error_of(data)["code"] == "method_not_allowed"
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="nope", messages=HI)
    assert caught.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=HI, logprobs=True, top_logprobs=21)
    assert server.healthy()


def test_no_cors_headers_unless_asked(server):
    _, headers, _ = raw(server.port, "GET", "/v1/models", headers={"Origin": "http://evil.example"})
    assert not any(h.startswith("access-control-") for h in headers)
    status, headers, _ = raw(
        server.port,
        "OPTIONS",
        CHAT,
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert status >= 400 and not any(h.startswith("access-control-") for h in headers)


@pytest.mark.slow
def test_a_bridged_draft_serves_and_says_how_it_drafts(tiny_models, tmp_path):
    """A draft with another tokenizer (the target's pieces under other ids): the server says once how it drafts,
    and both the default drafter and a per-request `model+ngram` draft through the bridge."""
    home = write_home(tmp_path, tiny_models.target, tiny_models.draft_noisy, tiny_models.draft_same)
    running = start_server(home, "--target", str(tiny_models.target), "--draft", str(tiny_models.vocab_shuffled))
    try:
        client = running.client()
        for drafter in ("model", "model+ngram"):
            settings = {"max_tokens": 12, "temperature": 0, "extra_body": {"drafter": drafter}}
            response = client.completions.create(model="target.gguf", prompt="the man said", **settings)
            timings = response.model_extra["timings"]
            assert timings["draft_n"] > 0 and timings["draft_n_accepted"] > 0, timings
    finally:
        assert running.stop() == 143
    assert running.stderr().count("localspec: note: draft tokenizer differs: drafting on the") == 1


@pytest.mark.slow
def test_the_default_server_runs_four_slots_and_says_so(tiny_models, tmp_path):
    """`--parallel auto`, the default: four slots on the tiny pair, said in the start line and /health, and four
    concurrent greedy requests all answered alike."""
    home = write_home(tmp_path / "home", tiny_models.target, tiny_models.draft_noisy, tiny_models.draft_same)
    running = start_server(home, "--pair", "tiny")
    try:
        assert "4 slots sharing one --n-ctx of 2048 tokens" in running.stderr()  # one pool: four in one's memory
        slots = json.loads(raw(running.port, "GET", "/health")[2])["slots"]
        assert slots["total"] == 4 and slots["shared_ctx"] == 2048
        answers: list[str] = []
        threads = [
            threading.Thread(
                target=lambda: answers.append(chat(running.client(), max_tokens=8).choices[0].message.content)
            )
            for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert len(answers) == 4 and len(set(answers)) == 1
    finally:
        assert running.stop() == 143, running.stderr()
