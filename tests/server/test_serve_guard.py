"""`localspec serve` locked down and stopped: --api-key, --cors, --no-swap, the flag checks, SIGTERM mid-stream,
and a fuzz of request bodies — each against a real server subprocess, each case leaving it healthy."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import time

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.server import WAIT, error_of, raw, start_server, write_home

from localspec.cli.main import main
from localspec.server.app import _host_name, is_loopback

KEY = "s3cret-key"
ORIGIN = "http://localhost:3000"
HI = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def home(tiny_models, tmp_path_factory):
    return write_home(
        tmp_path_factory.mktemp("guard-home"), tiny_models.target, tiny_models.draft_noisy, tiny_models.draft_same
    )


@pytest.fixture(scope="module")
def server(home):
    running = start_server(home, "--pair", "tiny", "--api-key", KEY, "--cors", ORIGIN, "--no-swap")
    yield running
    assert running.stop(signal.SIGINT) == 130, running.stderr()
    assert "Traceback" not in running.stderr() and "Traceback" not in running.log()


def test_the_api_key_is_required_except_for_health(server):
    body = {"messages": HI, "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": "Basic " + KEY}):
        status, _, data = raw(server.port, "POST", CHAT, body, headers=headers)
        assert status == 401 and error_of(data)["code"] == "invalid_api_key"
    status, _, _ = raw(server.port, "POST", CHAT, body, headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200
    assert raw(server.port, "GET", "/v1/models")[0] == 401
    assert server.healthy()
    with pytest.raises(openai.AuthenticationError):
        server.client().models.list()
    assert [m.id for m in server.client(api_key=KEY).models.list()][0] == "tiny"


def test_cors_headers_only_for_the_named_origin(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    _, headers, _ = raw(server.port, "GET", "/v1/models", headers={**auth, "Origin": ORIGIN})
    assert headers.get("access-control-allow-origin") == ORIGIN
    _, headers, _ = raw(server.port, "GET", "/v1/models", headers={**auth, "Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in headers
    preflight = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    }
    status, headers, _ = raw(server.port, "OPTIONS", CHAT, headers=preflight)
    assert status == 200 and headers.get("access-control-allow-origin") == ORIGIN


def test_a_refused_preflight_is_the_error_object(server):
    preflight = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
    status, headers, data = raw(server.port, "OPTIONS", CHAT, headers=preflight)
    error = error_of(data)
    assert status == 400 and error["code"] == "cors_refused" and "Disallowed CORS origin" in error["message"]
    assert headers["content-type"] == "application/json" and "--cors" in error["message"]


@pytest.mark.slow
def test_a_non_ascii_api_key_matches_the_utf8_a_client_sends(home):
    key = "clé-ünïcode"
    running = start_server(home, "--pair", "tiny", "--api-key", key)
    try:
        body = {"messages": HI, "max_tokens": 2}
        for sent, status in ((key.encode(), 200), (key.encode("latin-1"), 401), (b"cle", 401)):
            got, _, data = raw(running.port, "POST", CHAT, body, headers={"Authorization": b"Bearer " + sent})
            assert got == status, (sent, data)
    finally:
        running.stop()


def test_no_swap_refuses_another_pair_and_unknown_names_are_404(server):
    client = server.client(api_key=KEY)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny-same", messages=HI, max_tokens=2)
    assert caught.value.body["code"] == "model_not_loaded" and caught.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=HI, max_tokens=2)
    assert client.chat.completions.create(model="tiny", messages=HI, max_tokens=2).model == "tiny"


@pytest.mark.slow
def test_files_without_a_chat_template_serve_completions_and_refuse_chats(home, tiny_models):
    server = start_server(home, "--target", str(tiny_models.no_template), "--drafter", "ngram")
    try:
        client = server.client()
        assert [m.id for m in client.models.list()][0] == "no_template.gguf"
        text = client.completions.create(model="no_template.gguf", prompt="the man said", max_tokens=8)
        assert text.choices[0].finish_reason == "length" and text.usage.completion_tokens == 8
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="no_template.gguf", messages=HI, max_tokens=4)
        assert caught.value.body["code"] == "chat_template_error" and "--chat-template" in caught.value.body["message"]
        with pytest.raises(openai.BadRequestError) as caught:  # no draft model loaded: the model drafter cannot run
            client.completions.create(
                model="no_template.gguf", prompt="x", max_tokens=4, extra_body={"drafter": "model"}
            )
        assert caught.value.body["param"] == "drafter"
        assert server.healthy()
    finally:
        assert server.stop() == 143
    assert "Traceback" not in server.stderr()


def test_loopback_names():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "192.168.1.2", "evil.example", "localhost.evil.example", ""))
    assert [_host_name(h) for h in ("[::1]:8080", "localhost:80", "127.0.0.1", "::1")] == [
        "::1",
        "localhost",
        "127.0.0.1",
        "::1",
    ]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--port", "0"], "--port 0 is not a TCP port"),
        (["--port", "70000"], "--port 70000 is not a TCP port"),
        (["--queue", "0"], "--queue 0 is out of range"),
        (["--api-key", " "], "--api-key is empty"),
        (["--temperature", "-1"], "temperature must be"),
        (["--cors", "*"], "--cors '*' would let any web page you visit drive this server"),
        (["--timeout", "0"], "--timeout 0 is out of range"),
    ],
)
def test_bad_flags_are_one_line_before_anything_loads(home, monkeypatch, capsys, flags, message):
    monkeypatch.setenv("LOCALSPEC_HOME", str(home))
    assert main(["serve", "--pair", "tiny", *flags]) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "loading" not in err


def test_another_address_warns_and_a_busy_port_fails_before_loading(home, monkeypatch, capsys):
    monkeypatch.setenv("LOCALSPEC_HOME", str(home))
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--pair", "tiny", "--host", "0.0.0.0", "--port", str(port)]) == 1
    err = capsys.readouterr().err  # one line: the address cannot serve, so no warning about who could reach it
    assert f"cannot listen on 0.0.0.0:{port}" in err and "loading" not in err and len(err.strip().splitlines()) == 1
    assert main(["serve", "--pair", "nope", "--host", "0.0.0.0", "--port", str(port)]) == 1  # now free
    err = capsys.readouterr().err  # a free address: the warning, then what stopped it
    assert "warning: no authentication" in err and "nope" in err and len(err.strip().splitlines()) == 2


def test_a_broken_models_toml_is_said_once(tmp_path, monkeypatch, capsys):
    (tmp_path / "models.toml").write_text("[pairs.x\n")
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    assert main(["serve", "--pair", "x"]) == 1
    err = capsys.readouterr().err
    assert "models.toml" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
@pytest.mark.parametrize(
    "sigs",
    [(signal.SIGTERM,), (signal.SIGHUP,), (signal.SIGTERM, signal.SIGTERM)],
    ids=["SIGTERM", "SIGHUP", "SIGTERM-twice"],
)
def test_sigterm_closes_the_open_stream_and_exits_143(home, sigs):
    """SIGHUP (the terminal that started it closed) stops the server as SIGTERM does; a second SIGTERM 20 ms after
    the first still lets the open stream end on its error event, `server_stopping` (issue 67)."""
    server = start_server(home, "--pair", "tiny")
    client = server.client()
    stream = client.chat.completions.create(model="tiny", messages=HI, max_tokens=1500, n=8, stream=True)
    next(iter(stream))
    for i, sig in enumerate(sigs):
        time.sleep(0.02 * i)
        server.process.send_signal(sig)
    with pytest.raises(openai.APIError, match="the server is stopping"):  # the client reads the error event
        list(stream)
    assert server.process.wait(WAIT) == 143  # a bound for a hung stop, not a timing
    assert "Traceback" not in server.stderr() and "localspec: terminated" in server.stderr()
    assert ("hung up: stopping as on SIGTERM" in server.stderr()) == (signal.SIGHUP in sigs)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
FIELDS = ["model", "messages", "prompt", "stream", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
          "stop", "n", "draft_max", "verify", "drafter", "adaptive", "logprobs", "tools", "stream_options",
          "presence_penalty", "frequency_penalty", "repeat_penalty", "max_completion_tokens", "p_min"]  # fmt: skip
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool"]), "content": JSON})
BODY = st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=5).flatmap(
    lambda body: st.fixed_dictionaries(
        {"messages": st.lists(MESSAGE, max_size=2) | JSON, "max_tokens": st.integers(-1, 4) | JSON}
    ).map(lambda base: {**body, **base})
)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODY, path=st.sampled_from([CHAT, "/v1/completions"]))
def test_fuzzed_bodies_get_an_answer_or_an_error_object_never_a_500(server, body, path):
    status, _, data = raw(server.port, "POST", path, body, headers={"Authorization": f"Bearer {KEY}"})
    assert status < 500 or status == 503, data
    if status != 200:
        error_of(data)
    elif not body.get("stream"):
        assert "choices" in json.loads(data)
    assert server.healthy()


@pytest.mark.slow
def test_any_origin_needs_the_key_and_half_sent_requests_are_dropped(home):
    """`--cors '*'` with `--api-key`: any page may call, with the key only. `--timeout 1`: a connection that never
    finishes its request's head is closed, and a body that stops halfway is a 408 — neither holds the server."""
    server = start_server(home, "--pair", "tiny", "--cors", "*", "--api-key", KEY, "--timeout", "1")
    try:
        auth = {"Authorization": f"Bearer {KEY}"}
        status, headers, _ = raw(server.port, "GET", "/v1/models", headers={**auth, "Origin": "http://any.example"})
        assert status == 200 and headers.get("access-control-allow-origin") == "*"
        status, _, _ = raw(server.port, "GET", "/v1/models", headers={"Origin": "http://any.example"})
        assert status == 401
        with socket.create_connection(("127.0.0.1", server.port), timeout=20) as half:
            half.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            assert half.recv(1024) == b""  # closed by the server (a timeout here: held forever)
        with socket.create_connection(("127.0.0.1", server.port), timeout=20) as half:
            head = f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            head += "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            half.sendall(head.encode() + b'{"messages": [')
            answer = http.client.HTTPResponse(half)
            answer.begin()
            assert answer.status == 408 and error_of(answer.read())["code"] == "request_timeout"
        assert server.healthy()
    finally:
        assert server.stop() == 143, server.stderr()
    assert "Traceback" not in server.stderr() and "Traceback" not in server.log()
