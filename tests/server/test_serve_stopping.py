"""`serve` stopping. A stop while the router loads a pair (issue 44): what it cannot answer is 503 + Retry-After, never
an empty 200 (a cancelled load used to generate nothing and answer `"choices": []`) nor a 499 for requests whose
client is still there — the real `Pairs` and `Runner` on the tiny pairs, the stop being what uvicorn's SIGTERM
handler calls (`Pairs.cancel_all`). And the real server stopped (issue 67) by SIGTERM or SIGINT in the middle of each
thing it does — a stream, a whole chat, a load waiting for room, an unload (the embeddings batch:
test_serve_embeddings.py): it exits 130 / 143 within a generous bound, on one line, no traceback on the terminal nor in
its log, and every client it leaves is answered its protocol's error object (503 `server_stopping`), a stream its
error event."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import threading

import pytest
from support.server import WAIT, anthropic_error_of, error_of, raw, start_server, stop_cleanly, write_home

from localspec.core.session import Message
from localspec.models.flags import RunFlags
from localspec.server import runner as runner_mod
from localspec.server.api import ApiError
from localspec.server.pairs import Pairs
from localspec.server.request import Request
from localspec.server.runner import Runner

HI = Request(messages=(Message("user", "hi"),), prompt=None, max_tokens=4)


def test_a_stop_while_the_router_loads_a_pair_answers_503_with_retry_after(chat_home):
    """The router (`Pairs`) loading "tiny-same" for two requests queued on it when the stop comes: the load cannot be
    interrupted once the weights are in, and both requests are answered 503 `server_stopping` with Retry-After —
    neither an empty 200 (a cancelled load used to generate nothing and answer `"choices": []`) nor a 499 for
    requests whose client is still there."""
    router = Pairs(RunFlags(pair="tiny"), chat_home, names=("tiny", "tiny-same"))
    try:
        router.start()
        runner = router.runner("tiny-same")
        real_load = runner.load

        def load_then_stop():
            served = real_load()
            router.cancel_all()  # SIGTERM while the pair loaded (what uvicorn's handler calls)
            return served

        runner.load = load_then_stop
        _, first = router.submit("tiny-same", HI)  # its turn loads the pair
        _, second = router.submit("tiny-same", HI)  # queued behind it
        for future in (first, second):
            with pytest.raises(ApiError) as caught:  # before: an Outcome with no choice (200), then a 499
                future.result(timeout=60)
            assert caught.value.status == 503 and caught.value.headers == {"Retry-After": "1"}
            assert caught.value.code == "server_stopping"
        assert router.runner("tiny").served is not None  # the default pair was never part of it
    finally:
        router.close()


def test_the_pair_is_loaded_on_the_thread_that_decodes_its_requests(chat_home, caplog):
    # Loaded on the main thread and decoded on the worker, the demo pair ran at 0.57× `generate` on 2 cores: two
    # OpenMP thread pools (DESIGN §7). `start` loads on the worker, so one thread does every decode.
    import logging
    import threading

    runner = Runner(RunFlags(pair="tiny"), chat_home)
    try:
        with caplog.at_level(logging.WARNING, logger="localspec.llama.context"):
            runner.start()
            job, future = runner.submit(HI)
            assert future.result(60).generations[0].tokens
        assert "another thread" not in caplog.text
        threads = {seq.ctx.decoding_thread for seq in runner.served.engine.caches}
        worker = runner._executor.submit(threading.get_ident).result()
        assert threads == {worker}
    finally:
        runner.close()


def test_a_stop_while_a_pair_loads_abandons_the_load(chat_home, monkeypatch):
    """SIGTERM while the weights load: llama.cpp's load stops at its next tensor (not the whole file read first) and
    the request waiting for it is told the server stops."""
    runner = Runner(RunFlags(pair="tiny"), chat_home)
    told: list[float] = []

    def progress_then_stop(of):
        shown = real(of)

        def on_fraction(fraction: float):
            told.append(fraction)
            runner.cancel_all()  # the stop arrives while the weights load
            return shown(fraction)

        return on_fraction

    real = runner_mod._log_progress
    monkeypatch.setattr(runner_mod, "_log_progress", progress_then_stop)
    try:
        with pytest.raises(ApiError) as caught:  # before: the load went on and the pair was served
            runner.start()
        assert caught.value.status == 503 and caught.value.code == "server_stopping"
        assert len(told) == 1 and runner.served is None
    finally:
        runner.close()


def test_a_stop_after_the_weights_loaded_warms_no_slots(chat_home, monkeypatch):
    """SIGTERM once the pair's weights and contexts are in: its slots are not made and warmed (seconds on a real
    model) for a server that exits; the waiting request is told the server stops."""
    runner = Runner(RunFlags(pair="tiny"), chat_home, parallel=2)
    real = runner_mod.load_with_flags

    def load_then_stop(*args, **kwargs):
        loaded = real(*args, **kwargs)
        runner.cancel_all()  # the stop arrives as the load returns
        return loaded

    monkeypatch.setattr(runner_mod, "load_with_flags", load_then_stop)
    try:
        with pytest.raises(ApiError) as caught:
            runner.start()
        assert caught.value.code == "server_stopping" and runner.scheduler._pool is None
    finally:
        runner.close()


LONG = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000, "n": 8, "temperature": 1}
CLAUDE = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}


class Client(threading.Thread):
    """One HTTP request sent from a thread of its own: `responded` once its head came (a stream has begun), then its
    (status, headers, body) once whole."""

    def __init__(self, port: int, path: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.port, self.path, self.body = port, path, body
        self.responded = threading.Event()
        self.answer: tuple[int, dict, bytes] | None = None

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT)
        try:
            conn.request("POST", self.path, body=json.dumps(self.body), headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            self.responded.set()
            head = {k.lower(): v for k, v in response.getheaders()}
            self.answer = (response.status, head, response.read())
        finally:
            conn.close()

    def result(self) -> tuple[int, dict, bytes]:
        self.join(60)
        assert self.answer is not None, f"no answer to {self.path}"
        return self.answer


@pytest.fixture
def tiny_home(tiny_models, tmp_path):
    return write_home(tmp_path / "home", tiny_models.target, tiny_models.draft_noisy, tiny_models.draft_same)


def health(server) -> dict:
    return json.loads(raw(server.port, "GET", "/health")[2])


def stopped_503(answer: tuple[int, dict, bytes], error_of=error_of) -> dict:
    """The error object of a request the stop answered: 503 + Retry-After, `server_stopping` (OpenAI's shape, or
    Anthropic's with `anthropic_error_of`)."""
    status, headers, body = answer
    assert status == 503 and headers.get("retry-after"), (status, body)
    error = error_of(body)
    assert error.get("code", "server_stopping") == "server_stopping" and "stopping" in error["message"], error
    return error


def last_event(body: bytes) -> dict:
    """The last JSON event of a server-sent event stream (before OpenAI's `[DONE]`)."""
    datas = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ") and line != "data: [DONE]"]
    return json.loads(datas[-1])


@pytest.mark.slow
def test_sigterm_during_a_whole_chat_answers_its_client_503(tiny_home):
    server = start_server(tiny_home, "--pair", "tiny", "--parallel", "1")
    try:
        chat = Client(server.port, "/v1/chat/completions", LONG)  # 16,000 tokens: running when the stop comes
        chat.start()
        server.wait_until(lambda: health(server)["slots"]["busy"] == 1, "the chat to run")
        stop_cleanly(server, signal.SIGTERM)
        assert stopped_503(chat.result())  # before: a 200 of cancelled choices, or uvicorn's text 500
    finally:
        server.stop(signal.SIGKILL)


@pytest.mark.slow
def test_sigint_during_a_stream_ends_it_on_the_error_event_and_answers_the_queued(tiny_home):
    """Ctrl+C while one client streams and another (Anthropic's Messages) waits in the queue behind it."""
    server = start_server(tiny_home, "--pair", "tiny", "--parallel", "1")
    try:
        stream = Client(server.port, "/v1/chat/completions", {**LONG, "stream": True})
        stream.start()
        server.wait_until(stream.responded.is_set, "the stream to begin")
        queued = Client(server.port, "/v1/messages", CLAUDE)
        queued.start()
        server.wait_until(lambda: health(server)["queue"] == 2, "the Messages request to wait in the queue")
        stop_cleanly(server, signal.SIGINT)
        status, _, body = stream.result()
        assert status == 200 and body.rstrip().endswith(b"data: [DONE]")
        assert last_event(body)["error"]["code"] == "server_stopping"  # before: the choices' finish "cancelled"
        assert stopped_503(queued.result(), anthropic_error_of)["type"] == "overloaded_error"
    finally:
        server.stop(signal.SIGKILL)


@pytest.mark.slow
def test_ctrl_c_twice_answers_a_client_waiting_for_a_load_its_error_object(tiny_home):
    """Ctrl+C twice is uvicorn's forced exit: it waits for no request and cancels those left as its loop closes.
    A Messages request waiting for its pair to load is still answered Anthropic's 503 (before: uvicorn's traceback
    and its text 500), and the load waiting for room ends with the server."""
    server = start_server(tiny_home, "--pair", "tiny", "--parallel", "1", "--max-loaded", "1")
    try:
        stream = Client(server.port, "/v1/chat/completions", {**LONG, "stream": True})
        stream.start()
        server.wait_until(stream.responded.is_set, "the stream to begin")
        waiting = Client(server.port, "/v1/messages", {**CLAUDE, "model": "tiny-same"})
        waiting.start()
        server.wait_until(lambda: "tiny-same" in health(server)["pairs"], "tiny-same to wait for room")
        stop_cleanly(server, signal.SIGINT, again=True)
        assert stopped_503(waiting.result(), anthropic_error_of)["type"] == "overloaded_error"
        assert b"Internal Server Error" not in stream.result()[2]
    finally:
        server.stop(signal.SIGKILL)


@pytest.mark.slow
def test_sigterm_while_a_pair_waits_for_room_and_another_to_unload(tiny_home):
    """--max-loaded 1: a load of tiny-same waits for room while tiny streams, and an unload of tiny waits for the
    stream to end. The stop answers both at once and ends the wait for room (before: up to --load-timeout)."""
    server = start_server(tiny_home, "--pair", "tiny", "--parallel", "1", "--max-loaded", "1")
    try:
        stream = Client(server.port, "/v1/chat/completions", {**LONG, "stream": True})
        stream.start()
        server.wait_until(stream.responded.is_set, "the stream to begin")
        load = Client(server.port, "/models/load", {"model": "tiny-same"})
        load.start()
        server.wait_until(lambda: "tiny-same" in health(server)["pairs"], "tiny-same to wait for room")
        unload = Client(server.port, "/models/unload", {"model": "tiny"})
        unload.start()
        asked = "unloading tiny once its requests end"
        server.wait_until(lambda: asked in server.stderr() or unload.answer is not None, "the unload to wait")
        stop_cleanly(server, signal.SIGTERM)
        assert stopped_503(load.result()) and stopped_503(unload.result())
        assert last_event(stream.result()[2])["error"]["code"] == "server_stopping"
    finally:
        server.stop(signal.SIGKILL)


@pytest.mark.slow
def test_sigterm_while_a_body_still_arrives_answers_its_error_object(tiny_home):
    """A client sending its body slowly holds no stop: it is answered Anthropic's 503 at once (before: uvicorn's
    grace period ran out, the task was cancelled with a traceback and a text 500)."""
    server = start_server(tiny_home, "--pair", "tiny")
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as sock:
            sock.sendall(
                b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\nExpect: 100-continue\r\n\r\n"
            )
            answer = b""
            while b"\r\n\r\n" not in answer:  # "100 Continue": the route is reading the body
                answer += sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 100"), answer
            sock.sendall(b'{"model"')  # and the rest never comes
            stop_cleanly(server, signal.SIGTERM)
            while more := sock.recv(65536):
                answer += more
        head, _, body = answer.split(b"\r\n\r\n", 1)[1].partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and anthropic_error_of(body)["type"] == "overloaded_error"
    finally:
        server.stop(signal.SIGKILL)
