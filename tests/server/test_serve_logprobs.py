"""`logprobs` / `top_logprobs` over HTTP (issue 46) with the real `openai` client, on the tiny pair with speculation:
the shape OpenAI gives, one law everywhere (the target's raw softmax), an accepted draft token scored by the target,
and at temperature 0 the chosen token is the top one."""

from __future__ import annotations

import math

import openai
import pytest
from support.server import start_server, write_home


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    home = write_home(
        tmp_path_factory.mktemp("logprobs-home"), tiny_models.target, tiny_models.draft_noisy, tiny_models.draft_same
    )
    running = start_server(home, "--pair", "tiny-same", "--draft-max", "4", "--no-adaptive")
    yield running
    running.stop()


ASK = [{"role": "user", "content": "the man said"}]


def test_chat_logprobs_shape_and_values(server):
    reply = server.client().chat.completions.create(
        model="tiny-same", messages=ASK, max_tokens=12, logprobs=True, top_logprobs=5, temperature=0
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert reply.model_dump()["timings"]["draft_n_accepted"] > 0  # some of these tokens were drafts
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 5
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)  # T 0: the chosen token is the top
        assert entry.top_logprobs[0].token == entry.token
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)
        assert sum(math.exp(t.logprob) for t in entry.top_logprobs) <= 1 + 1e-9
    assert "".join(e.token for e in content) == reply.choices[0].message.content


def test_the_law_does_not_depend_on_speculation_or_temperature(server):
    """One law: the same tokens score the same with and without drafting, at T 0 and at T 1 with top-k 1."""

    def scores(**body):
        reply = server.client().chat.completions.create(
            model="tiny-same", messages=ASK, max_tokens=8, logprobs=True, **body
        )
        return [(e.token, round(e.logprob, 4)) for e in reply.choices[0].logprobs.content]

    plain = scores(temperature=0, extra_body={"draft_max": 0})
    assert scores(temperature=0) == plain
    assert scores(temperature=1, extra_body={"top_k": 1}) == plain


def test_streamed_logprobs_equal_the_whole(server):
    body = dict(model="tiny-same", messages=ASK, max_tokens=10, logprobs=True, top_logprobs=2, temperature=0)
    whole = server.client().chat.completions.create(**body).choices[0].logprobs.content
    streamed = []
    for chunk in server.client().chat.completions.create(**body, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in whole]


def test_completions_logprobs(server):
    reply = server.client().completions.create(model="tiny-same", prompt="the man said", max_tokens=6, logprobs=3)
    lp = reply.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert all(len(top) == 3 for top in lp.top_logprobs) and lp.text_offset[0] == 0


@pytest.mark.parametrize(
    "body,match",
    [
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ({"top_logprobs": 2}, "logprobs"),
    ],
)
def test_bad_logprobs_are_a_400_naming_the_field(server, body, match):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(model="tiny-same", messages=ASK, **body)
    assert match in e.value.body["message"] or match == e.value.body["param"], e.value.body


@pytest.mark.parametrize("logprobs", [21, -1])
def test_completions_logprobs_out_of_range_are_a_400_and_the_server_serves_on(server, logprobs):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().completions.create(model="tiny-same", prompt="the man said", max_tokens=2, logprobs=logprobs)
    assert "logprobs" in e.value.body["message"] or e.value.body["param"] == "logprobs", e.value.body
    assert server.client().completions.create(model="tiny-same", prompt="the man said", max_tokens=2).choices
