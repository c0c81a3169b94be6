"""`serve` holding several pairs (issue 57): a request's `model` picks the pair, loaded on demand on its own engine
thread; unknown, missing and broken pairs are one line and the server lives; `--max-loaded` and `keep_alive` unload;
`/v1/models` lists every pair to OpenAI's and Anthropic's clients; the admin routes load and unload."""

from __future__ import annotations

import asyncio
import json
import threading

import anthropic
import numpy as np
import pytest
from support.server import error_of, raw, start_server
from support.tinymodels import make_llama_tensors, write_llama_model

from localspec.core.session import Message
from localspec.models.flags import RunFlags
from localspec.server.api import ApiError
from localspec.server.pairs import Pairs
from localspec.server.request import Request

ASK = [{"role": "user", "content": "the man said"}]


def _home(root, m):
    """Pairs "tiny" (the default), "other" (another target alone), "broken" (a truncated file), "missing", "nan" (a
    sound file whose weights compute NaN)."""
    root.mkdir(parents=True, exist_ok=True)
    tensors = make_llama_tensors(0)
    tensors["output_norm.weight"] = np.full_like(tensors["output_norm.weight"], np.nan)  # every logit NaN
    nan = write_llama_model(root / "nan-weights.gguf", base=tensors)
    (root / "models.toml").write_text(
        'default = "tiny"\n'
        f'[pairs.tiny]\ntarget = {{ path = "{m.target}" }}\ndraft = {{ path = "{m.draft_noisy}" }}\n'
        "temperature = 0.0\nn_ctx = 512\n"
        f'[pairs.other]\ntarget = {{ path = "{m.draft_unrelated}" }}\ntemperature = 0.0\nn_ctx = 256\n'
        f'[pairs.broken]\ntarget = {{ path = "{m.truncated}" }}\n'
        f'[pairs.missing]\ntarget = {{ path = "{root / "nowhere.gguf"}" }}\n'
        f'[pairs.nan]\ntarget = {{ path = "{nan}" }}\ntemperature = 0.0\nn_ctx = 256\n',
        encoding="utf-8",
    )
    return root


@pytest.fixture(scope="module")
def home(tmp_path_factory, tiny_models):
    return _home(tmp_path_factory.mktemp("pairs-home"), tiny_models)


@pytest.fixture(scope="module")
def server(home):
    running = start_server(home, "--parallel", "1")
    yield running
    running.stop()
    assert "Traceback" not in running.stderr()


def _answer(client, model: str, **extra) -> str:
    reply = client.chat.completions.create(model=model, messages=ASK, max_tokens=12, temperature=0, **extra)
    assert reply.model == model
    return reply.choices[0].message.content


def _pairs(server) -> dict:
    return json.loads(raw(server.port, "GET", "/health")[2])["pairs"]


@pytest.mark.slow
def test_alternate_requests_answer_as_a_server_of_that_pair_alone(server, home, tiny_models):
    client = server.client()
    answers = {name: [_answer(client, name) for _ in range(2)] for name in ("tiny", "other")}
    assert _answer(client, "tiny") == answers["tiny"][0] and _answer(client, "other") == answers["other"][0]
    assert answers["tiny"][0] != answers["other"][0]  # two models, not one
    assert set(_pairs(server)) == {"tiny", "other"}
    for name in ("tiny", "other"):
        alone = start_server(home, "--pair", name, "--no-swap", "--parallel", "1")
        try:
            assert _answer(alone.client(), name) == answers[name][0] == answers[name][1]
        finally:
            alone.stop()


def test_unknown_missing_and_broken_pairs_are_one_line_and_the_server_lives(server):
    body = {"model": "nope", "messages": ASK, "max_tokens": 2}
    status, _, data = raw(server.port, "POST", "/v1/chat/completions", body)
    assert status == 404 and error_of(data)["code"] == "model_not_found"
    status, _, data = raw(server.port, "POST", "/v1/chat/completions", {**body, "model": "missing"})
    assert status == 404 and "run `localspec pull missing`" in error_of(data)["message"]
    status, _, data = raw(server.port, "POST", "/v1/chat/completions", {**body, "model": "broken"})
    assert status == 503 and error_of(data)["code"] == "model_load_failed", data
    assert "could not load 'broken'" in error_of(data)["message"]
    assert server.healthy() and _answer(server.client(), "tiny")


def test_the_clients_list_every_pair_and_choose_one(server):
    listed = {m.id: m for m in server.client().models.list()}
    assert {"tiny", "other", "broken", "missing"} <= set(listed) and "gemma3-12b" not in listed  # not pulled
    tiny = listed["tiny"].model_extra
    assert tiny["loaded"] and tiny["available"] and tiny["context"] == 512 and tiny["vision"] is False
    assert listed["missing"].model_extra["available"] is False and not listed["missing"].model_extra["loaded"]
    claude = anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="none", max_retries=0)
    assert {m.id for m in claude.models.list()} == set(listed)
    reply = claude.messages.create(model="other", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert reply.model == "other" and reply.content


def test_keep_alive_unloads_and_the_admin_routes_load_and_unload(server):
    _answer(server.client(), "other", extra_body={"keep_alive": 0})
    server.wait_until(lambda: "other" not in _pairs(server), "the keep-alive to unload 'other'")
    status, _, data = raw(server.port, "POST", "/models/load", {"model": "other"})
    assert status == 200 and json.loads(data)["loaded"] is True and _pairs(server)["other"]["loaded"]
    assert _pairs(server)["other"]["memory"] > 0 and _pairs(server)["other"]["slots"]["total"] == 1
    status, _, data = raw(server.port, "POST", "/models/unload", {"model": "other"})
    assert status == 200 and json.loads(data)["loaded"] is False and "other" not in _pairs(server)
    status, _, data = raw(server.port, "POST", "/models/load", {"model": "nope"})
    assert status == 404 and error_of(data)["code"] == "model_not_found"
    status, _, data = raw(
        server.port, "POST", "/v1/chat/completions", {"model": "tiny", "messages": ASK, "keep_alive": "soon"}
    )
    assert status == 400 and "keep_alive" in error_of(data)["message"]


@pytest.mark.parametrize(
    "value",
    ["1" + "0" * 400, "1e400", "-1e400", "[]", "NaN", "Infinity", '"soon"'],
    ids=["10**400", "1e400", "-1e400", "list", "NaN", "Infinity", "word"],
)
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/models/load"])
def test_a_keep_alive_that_is_no_finite_duration_is_a_400_naming_it(server, route, value):
    """Before: 10**400 and [] were a 500 (OverflowError, AttributeError), 1e400 on chat "not a valid integer"."""
    body = f'{{"model": "tiny", "messages": {json.dumps(ASK)}, "max_tokens": 1, "keep_alive": {value}}}'
    status, _, data = raw(server.port, "POST", route, body)
    error = error_of(data)
    if route != "/models/load" and value in ("NaN", "Infinity"):  # no JSON number: every field of a body says so
        assert status == 400 and error["code"] == "invalid_json", error
        return
    assert (status, error["code"], error["param"]) == (400, "invalid_value", "keep_alive"), error
    assert "keep_alive" in error["message"] and len(error["message"]) < 200, error
    assert server.healthy()


def test_a_pair_whose_weights_compute_nan_is_the_servers_error_not_the_clients(server):
    """Before: 400 invalid_request_error, the client blamed for a damaged file."""
    ask = {"model": "nan", "messages": ASK, "max_tokens": 4}
    for route, body in [
        ("/v1/chat/completions", ask),
        ("/v1/completions", {"model": "nan", "prompt": "the man said", "max_tokens": 4}),
        ("/v1/responses", {"model": "nan", "input": "the man said", "max_output_tokens": 4}),
    ]:
        status, _, data = raw(server.port, "POST", route, body)
        error = error_of(data)
        assert (status, error["type"], error["code"]) == (500, "server_error", "model_error"), (route, error)
        assert "computed logits that are not numbers" in error["message"] and "re-download it" in error["message"]
    status, _, data = raw(server.port, "POST", "/v1/messages", ask)
    assert status == 500 and json.loads(data)["error"]["type"] == "api_error", data
    status, _, data = raw(server.port, "POST", "/v1/chat/completions", {**ask, "stream": True})
    chunks = [json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: {")]
    assert status == 200 and chunks[-1]["error"]["type"] == "server_error", data
    assert chunks[-1]["error"]["code"] == "model_error", data
    assert server.healthy() and _answer(server.client(), "tiny")


@pytest.mark.slow
def test_max_loaded_one_unloads_the_other_pair_and_loads_it_again(home):
    running = start_server(home, "--parallel", "1", "--max-loaded", "1", "--keep-alive", "10m")
    try:
        client = running.client()
        first = _answer(client, "tiny")
        assert _answer(client, "other") and set(_pairs(running)) == {"other"}
        assert _answer(client, "tiny") == first and set(_pairs(running)) == {"tiny"}
        assert "unloading other to make room (--max-loaded 1)" in running.stderr()
    finally:
        running.stop()
    assert "Traceback" not in running.stderr()


def test_a_request_waits_for_its_pair_to_load_while_others_answer(chat_home, monkeypatch):
    """In process: "tiny-same" loads slowly; "tiny" answers meanwhile; past the load timeout a request is 503."""
    pairs = Pairs(RunFlags(pair="tiny"), chat_home, names=("tiny", "tiny-same"), load_timeout=30)
    hi = Request(messages=(Message("user", "hi"),), prompt=None, max_tokens=4)
    release = threading.Event()
    try:
        pairs.start()
        slow = pairs.runner("tiny-same")
        real_load = slow.load

        def held_load():
            release.wait(30)
            return real_load()

        monkeypatch.setattr(slow, "load", held_load)

        async def scenario():
            waiting = asyncio.ensure_future(pairs.ready("tiny-same"))
            await asyncio.sleep(0.3)
            assert not waiting.done() and slow.loading is None and slow.served is None
            _, future = pairs.submit(await pairs.ready("tiny"), hi)  # the loaded pair answers meanwhile
            assert (await asyncio.wrap_future(future)).generations[0].tokens
            pairs.load_timeout = 0.2
            with pytest.raises(ApiError) as late:
                await pairs.ready("tiny-same")
            assert late.value.status == 503 and late.value.code == "model_loading"
            release.set()
            assert await waiting == "tiny-same"

        asyncio.run(scenario())
        _, future = pairs.submit("tiny-same", hi)
        assert future.result(60).served.name == "tiny-same"
        assert {"tiny", "tiny-same"} <= set(pairs.model_ids())
    finally:
        release.set()
        pairs.close()


@pytest.mark.slow
def test_the_demo_pair_and_a_tiny_pair_in_one_server_answer_as_each_alone(demo_home, tiny_models, tmp_path):
    """Issue 57's own case: the real demo pair (SmolLM2 F32 drafted by its Q4_1, from PyPI) beside a tiny pair in one
    server, requests alternating between them; each greedy answer is what a server of that pair alone gives."""
    from localspec.paths import get_paths

    home = tmp_path / "home"
    home.mkdir()
    get_paths({"LOCALSPEC_HOME": str(home)}).data_dir.symlink_to(get_paths({"LOCALSPEC_HOME": str(demo_home)}).data_dir)
    tiny = f'target = {{ path = "{tiny_models.target}" }}\ndraft = {{ path = "{tiny_models.draft_noisy}" }}\n'
    (home / "models.toml").write_text(
        f"[pairs.tiny]\n{tiny}temperature = 0.0\nn_ctx = 512\n",
        encoding="utf-8",
    )
    together = start_server(home, "--parallel", "1", "--pair", "demo", "--pair", "tiny")
    try:
        client = together.client()
        answers = [_answer(client, name) for name in ("demo", "tiny", "demo", "tiny")]
        assert set(_pairs(together)) == {"demo", "tiny"}
    finally:
        together.stop()
    assert answers[0] == answers[2] and answers[1] == answers[3] and answers[0] != answers[1]
    alone = start_server(home, "--pair", "demo", "--no-swap", "--parallel", "1")
    try:
        assert _answer(alone.client(), "demo") == answers[0]
    finally:
        alone.stop()
