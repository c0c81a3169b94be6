"""`localspec serve` on the tiny thinking models (a real uvicorn subprocess, the real `openai` client): responses
carry the thinking in `reasoning_content` beside the answer (the message, and the stream's deltas) as llama-server
and DeepSeek's API do, `chat_template_kwargs.enable_thinking` switches it, a thinking handed back in a later request
follows the template's rule, and what a model cannot follow is a 400 naming the field."""

from __future__ import annotations

import json

import pytest
from support.server import error_of, raw, start_server, write_home
from support.tinymodels import ANSWER_TEXT, REASONING_TEXT

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(tiny_models, thinking_models, tmp_path_factory):
    home = write_home(
        tmp_path_factory.mktemp("serve-thinking"), tiny_models.target, tiny_models.draft_noisy, tiny_models.draft_same
    )
    m = thinking_models
    with (home / "models.toml").open("a", encoding="utf-8") as f:
        f.write(
            f'[pairs.thinking]\ntarget = {{ path = "{m.target}" }}\ndraft = {{ path = "{m.draft}" }}\n'
            "temperature = 0.0\nn_ctx = 1024\n"
            f'[pairs.always]\ntarget = {{ path = "{m.no_switch}" }}\ndraft = {{ path = "{m.no_switch}" }}\n'
            "temperature = 0.0\nn_ctx = 1024\n"
        )
    running = start_server(home, "--pair", "thinking", "--draft-max", "4", "--no-adaptive")
    yield running
    assert running.stop() == 143, running.stderr()
    assert "Traceback" not in running.stderr() and "Traceback" not in running.log()


def test_the_message_has_the_reasoning_beside_the_content(server):
    response = server.client().chat.completions.create(model="thinking", messages=HI, max_tokens=40)
    message = response.choices[0].message
    assert message.content == ANSWER_TEXT
    assert message.model_extra["reasoning_content"] == REASONING_TEXT
    assert response.usage.completion_tokens_details.reasoning_tokens == 11
    parts = response.model_extra["localspec"]["parts"]
    assert parts["thinking"]["tokens"] + parts["answer"]["tokens"] == response.usage.completion_tokens
    assert parts["thinking"]["acceptance_rate"] == 1.0 and parts["answer"]["acceptance_rate"] < 1.0


def test_the_stream_has_reasoning_deltas_then_content_deltas(server):
    stream = server.client().chat.completions.create(model="thinking", messages=HI, max_tokens=40, stream=True)
    order, reasoning, content = [], [], []
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if (extra := (delta.model_extra or {}).get("reasoning_content")) is not None:
            reasoning.append(extra)
            order.append("reasoning")
        if delta.content:
            content.append(delta.content)
            order.append("content")
    assert "".join(reasoning) == REASONING_TEXT and "".join(content) == ANSWER_TEXT
    assert order == sorted(order, key=lambda kind: kind == "content")  # all the thinking first


def test_enable_thinking_false_skips_the_thinking(server):
    status, _, body = raw(
        server.port,
        "POST",
        CHAT,
        {"model": "thinking", "messages": HI, "max_tokens": 40, "chat_template_kwargs": {"enable_thinking": False}},
    )
    data = json.loads(body)
    assert status == 200, data
    assert data["choices"][0]["message"]["content"] == ANSWER_TEXT
    assert "reasoning_content" not in data["choices"][0]["message"]
    assert (
        data["usage"]["completion_tokens"] == 4 and data["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    )


def test_thinking_handed_back_follows_the_templates_rule(server):
    def prompt_tokens(assistant: dict) -> int:
        messages = [*HI, assistant, {"role": "user", "content": "Again"}]
        status, _, body = raw(server.port, "POST", CHAT, {"model": "thinking", "messages": messages, "max_tokens": 1})
        assert status == 200, body
        return json.loads(body)["usage"]["prompt_tokens"]

    with_thinking = {"role": "assistant", "content": ANSWER_TEXT, "reasoning_content": REASONING_TEXT}
    # Qwen3's template drops the thinking of turns before the last user message: the same prompt either way
    assert prompt_tokens(with_thinking) == prompt_tokens({"role": "assistant", "content": ANSWER_TEXT})


@pytest.mark.parametrize(
    ("body", "param", "match"),
    [
        ({"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs.enable_thinking", "boolean"),
        ({"chat_template_kwargs": {"thinking_budget": 5}}, "chat_template_kwargs.thinking_budget", "unknown field"),
        (
            {"model": "always", "chat_template_kwargs": {"enable_thinking": False}},
            "chat_template_kwargs.enable_thinking",
            "has no thinking switch",
        ),
        (
            {"model": "tiny", "chat_template_kwargs": {"enable_thinking": True}},
            "chat_template_kwargs.enable_thinking",
            "tiny does not think",
        ),
    ],
    ids=["not-a-boolean", "unknown-key", "a-model-without-a-switch", "on-for-a-model-that-does-not-think"],
)
def test_what_cannot_be_followed_is_a_400_naming_the_field(server, body, param, match):
    status, _, answer = raw(server.port, "POST", CHAT, {"model": "thinking", "messages": HI, **body})
    error = error_of(answer)
    assert status == 400 and error["param"] == param and match in error["message"], error
    assert server.healthy()


def test_serve_think_off_on_a_model_without_a_switch_is_one_line(server):
    with pytest.raises(RuntimeError) as caught:
        start_server(server.home, "--pair", "always", "--think", "off")
    message = str(caught.value)
    assert "exited with 1" in message and "Traceback" not in message
    assert "always thinks: its chat template has no thinking switch" in message
    assert "so serve --think off cannot be followed" in message
    assert "loading always" not in message  # refused from the vocabulary and the template, before the weights load


def test_enable_thinking_false_is_what_a_model_that_does_not_think_does_anyway(server):
    """Clients send `enable_thinking: false` to every model: on one that does not think it changes nothing."""
    asked = {"model": "tiny", "messages": HI, "max_tokens": 6, "temperature": 0}
    status, _, plain = raw(server.port, "POST", CHAT, asked)
    status_off, _, off = raw(server.port, "POST", CHAT, {**asked, "chat_template_kwargs": {"enable_thinking": False}})
    assert status == status_off == 200, off
    assert json.loads(off)["choices"][0]["message"]["content"] == json.loads(plain)["choices"][0]["message"]["content"]


def test_tools_on_auto_leave_an_answer_in_words_as_it_was(server):
    """`tool_choice: auto` in Qwen3's own syntax is a lazy grammar: free text, `<think>` and `</think>` (special
    tokens no text terminal matches) included, until `<tool_call>`; an answer without a call is the same answer."""
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    plain = server.client().chat.completions.create(model="thinking", messages=HI, max_tokens=40)
    tooled = server.client().chat.completions.create(model="thinking", messages=HI, max_tokens=40, tools=[weather])
    assert tooled.choices[0].message.tool_calls is None and tooled.choices[0].finish_reason == "stop"
    assert tooled.choices[0].message.content == plain.choices[0].message.content == ANSWER_TEXT
    assert tooled.choices[0].message.model_extra["reasoning_content"] == REASONING_TEXT


@pytest.mark.parametrize("effort", ["none", "minimal", "low"])
def test_a_light_reasoning_effort_on_a_model_that_does_not_think_is_its_plain_answer(server, effort):
    """Before: chat refused `reasoning_effort`; Responses refused a low effort naming chat_template_kwargs (issue 63
    items 8 and 10)."""
    asked = {"model": "tiny", "messages": HI, "max_tokens": 6}
    plain = json.loads(raw(server.port, "POST", CHAT, asked)[2])["choices"][0]["message"]["content"]
    status, _, body = raw(server.port, "POST", CHAT, {**asked, "reasoning_effort": effort})
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == plain, body
    response = server.client().responses.create(
        model="tiny", input="Hi", max_output_tokens=6, reasoning={"effort": effort}
    )
    assert response.output_text == plain


def test_a_reasoning_effort_switches_a_thinking_models_thinking(server):
    def reasoning(effort: str) -> str | None:
        body = {"model": "thinking", "messages": HI, "max_tokens": 40, "reasoning_effort": effort}
        status, _, data = raw(server.port, "POST", CHAT, body)
        assert status == 200, data
        message = json.loads(data)["choices"][0]["message"]
        assert message["content"] == ANSWER_TEXT
        return message.get("reasoning_content")

    assert reasoning("low") == REASONING_TEXT and reasoning("none") is None
    response = server.client().responses.create(model="thinking", input="Hi", reasoning={"effort": "none"})
    assert response.output_text == ANSWER_TEXT and [item.type for item in response.output] == ["message"]


@pytest.mark.parametrize(
    ("model", "effort", "match"),
    [("tiny", "high", "tiny does not think"), ("always", "none", "has no thinking switch")],
    ids=["a-model-that-does-not-think", "a-model-without-a-switch"],
)
def test_an_effort_a_model_cannot_follow_is_a_400_naming_the_field_the_client_sent(server, model, effort, match):
    status, _, answer = raw(server.port, "POST", CHAT, {"model": model, "messages": HI, "reasoning_effort": effort})
    error = error_of(answer)
    assert status == 400 and error["param"] == "reasoning_effort", error
    assert match in error["message"] and f'reasoning_effort = "{effort}"' in error["message"], error
    body = {"model": model, "input": "Hi", "reasoning": {"effort": effort}}
    status, _, answer = raw(server.port, "POST", "/v1/responses", body)
    error = error_of(answer)
    assert status == 400 and error["param"] == "reasoning.effort", error
    assert match in error["message"] and "chat_template_kwargs" not in error["message"], error
