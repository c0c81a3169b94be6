"""`/v1/embeddings` never holds the engine (issue 55): inputs decoded many to a batch (and the same vectors as one
at a time), the job stopped between batches when its client leaves or the server stops, chats stepping between its
batches under `--parallel`, and a bound on the tokens one request may ask for. Real llama.cpp on the tiny pair,
the real `Runner` in-process and the real server."""

from __future__ import annotations

import http.client
import json
import signal
import time

import numpy as np
import pytest
from support.server import WAIT, error_of, raw, start_server, stop_cleanly, write_home, write_smol_home

from localspec.llama.embedding import SEQ_MAX, EmbeddingContext, packs
from localspec.llama.model import Model
from localspec.models.flags import RunFlags
from localspec.server.api import ApiError
from localspec.server.embeddings_route import TOKENS_MAX
from localspec.server.request import Request as ServerRequest
from localspec.server.request import Token
from localspec.server.runner import Runner

WORDS = "the man said that the water was hot and a cat sat on the mat".split()


def test_packs_keep_order_within_both_bounds():
    assert packs([], 10) == []
    assert packs([10, 1, 9, 5, 5, 1], 10) == [range(0, 1), range(1, 3), range(3, 5), range(5, 6)]
    lengths = [1] * (2 * SEQ_MAX + 3)
    assert [len(r) for r in packs(lengths, 10_000)] == [SEQ_MAX, SEQ_MAX, 3]


def test_a_batch_embeds_each_input_as_it_would_alone(tiny_models):
    with Model(tiny_models.target, n_gpu_layers=0) as model:
        context = EmbeddingContext(model, n_ctx=256, n_threads=2)
        try:
            inputs = [model.tokenize(" ".join(WORDS[: 2 + i]), add_special=True) for i in range(9)]
            inputs.append([5] * 200)  # long enough that 64 sequences' share of the cells could not hold it
            alone = [context.embed(tokens) for tokens in inputs]
            together: list[np.ndarray] = []
            for part in packs([len(t) for t in inputs], context.n_ctx):
                together += context.embed_batch([inputs[i] for i in part])
        finally:
            context.close()
    assert len(together) == len(alone) == 10
    for one, batched in zip(alone, together, strict=True):
        # one batch and one pass per input may differ in the last bits of a float32 sum, not more
        assert float(one @ batched) > 1 - 1e-5
    assert float(alone[0] @ alone[1]) < 1 - 1e-3  # the check can fail: different inputs, different vectors


def _work(runner: Runner, parts: list[str], n_inputs: int = 300):
    """Embeddings work as the route makes it, recording each part: many short inputs, several batches."""
    from localspec.server import embeddings_route

    def work(served):
        context = EmbeddingContext(served.engine.target_model, n_ctx=64, n_threads=2)
        try:
            tokens = [[1 + i % 50, 2, 3] for i in range(n_inputs)]
            vectors = []
            for part in packs([len(t) for t in tokens], context.n_ctx):
                parts.append("part")
                yield
                vectors += context.embed_batch([tokens[i] for i in part])
            return vectors
        finally:
            context.close()

    assert embeddings_route.packs is packs  # the route batches as this test does
    return work


def test_a_cancelled_embeddings_job_stops_between_batches(chat_home):
    for parallel in (1, 2):
        runner = Runner(RunFlags(pair="tiny", drafter="none"), chat_home, parallel=parallel)
        try:
            runner.start()
            parts: list[str] = []
            job, future = runner.submit(None, work=_work(runner, parts))
            while not parts:
                time.sleep(0.001)
            job.cancel()
            with pytest.raises(ApiError) as stopped:
                future.result(60)
        finally:
            runner.close()
        assert stopped.value.status == 499, parallel
        assert len(parts) < len(packs([3] * 300, 64)), parallel  # it stopped before its last batch


def test_chats_step_between_the_batches_of_an_embeddings_job(chat_home):
    runner = Runner(RunFlags(pair="tiny", drafter="none"), chat_home, parallel=2)
    order: list[str] = []
    try:
        runner.start()

        def emit(event) -> None:
            if isinstance(event, Token):
                order.append("token")

        _, chat = runner.submit(ServerRequest(None, "the water was", max_tokens=40), emit)
        while "token" not in order:
            time.sleep(0.001)
        _, embeddings = runner.submit(None, work=_work(runner, order, n_inputs=3000))
        vectors = embeddings.result(120)
        chat.result(120)
    finally:
        runner.close()
    assert len(vectors) == 3000
    first, last = order.index("part"), len(order) - 1 - order[::-1].index("part")
    assert "token" in order[first:last], order  # the chat answered while the job's batches ran


@pytest.fixture(scope="module")
def home(tiny_models, tmp_path_factory):
    return write_home(
        tmp_path_factory.mktemp("embeddings-home"), tiny_models.target, tiny_models.draft_noisy, tiny_models.draft_same
    )


@pytest.mark.slow
def test_a_request_past_the_token_bound_is_refused_before_decoding(home):
    server = start_server(home, "--pair", "tiny", "--n-ctx", "256")
    try:
        per_input = 64
        inputs = [[1] * per_input] * (TOKENS_MAX // per_input + 1)
        status, _, body = raw(server.port, "POST", "/v1/embeddings", {"input": inputs})
        error = error_of(body)
        assert status == 400 and error["code"] == "too_many_tokens" and error["param"] == "input", error
        assert f"at most {TOKENS_MAX}" in error["message"]
        assert server.healthy()
    finally:
        assert server.stop() == 143, server.stderr()


@pytest.mark.slow
def test_a_client_that_leaves_or_a_stop_ends_a_long_embeddings_request(smollm2_path, tmp_path):
    """2,048 inputs on SmolLM2 (many batches of a real 135M model): the client leaves, and the job stops at its next
    batch — the next chat is answered and the log says why; then SIGTERM mid-job: the waiting client is answered 503
    at once (not after the batch, past uvicorn's grace period: its traceback, issue 67), the server exits 143."""
    server = start_server(write_smol_home(tmp_path / "home", smollm2_path), "--pair", "smol", "--parallel", "1")
    body = json.dumps({"input": [" ".join(WORDS)] * 2048})
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT)
        conn.request("POST", "/v1/embeddings", body=body, headers={"Content-Type": "application/json"})
        server.wait_until(lambda: "embeddings: an embeddings context over smol" in server.log(), "the job to run")
        conn.sock.close()  # the client goes away
        conn.close()
        reply = server.client().chat.completions.create(
            model="smol", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert reply.choices[0].message.content is not None
        server.wait_until(lambda: "cancelled while it ran (client gone)" in server.log(), "the job to stop")
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT)
        conn.request("POST", "/v1/embeddings", body=body, headers={"Content-Type": "application/json"})
        server.wait_until(lambda: json.loads(raw(server.port, "GET", "/health")[2])["queue"] == 1, "the job")
        stop_cleanly(server, signal.SIGTERM)
        response = conn.getresponse()
        assert response.status == 503 and error_of(response.read())["code"] == "server_stopping"
        conn.close()
    finally:
        server.stop(signal.SIGKILL)
    assert "a request cancelled" in server.log() and "(server stopping)" in server.log()  # before it began, or ran
