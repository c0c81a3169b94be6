"""What six client frameworks really send (issue 63), replayed against a real `localspec serve --pair demo`.

tests/server/golden/ holds each request as a framework sent it (recorded by scripts/record_golden_requests.py with
the real packages): path, headers, body, and what a good answer must have. Each is sent as recorded but for its token
budget (at most TEXT_CAP, JSON_CAP where a tool call or JSON is expected; the server runs greedy) and must be
answered 200 in its protocol's shape: a stream ends with its terminal event, a forced tool's call is there with
arguments valid for the tool's schema, a schema's output parses and fits it (JSON mode's, once the answer finished).
The demo model is 135M: structure is checked, which the grammars guarantee, never what the answer says.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from support.server import raw, start_server

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(GOLDEN.glob("*.json"))
TEXT_CAP = 8  # tokens for an answer in words: its shape is all that is checked
JSON_CAP = 64  # enough for the grammar to close {"city": …, "country": …} or a tool's arguments
BUDGET = {
    "chat": ("max_completion_tokens", "max_tokens"),
    "responses": ("max_output_tokens",),
    "messages": ("max_tokens",),
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(demo_home):
    running = start_server(demo_home, "--pair", "demo", "--temperature", "0", "--max-tokens", str(TEXT_CAP))
    yield running
    running.stop()
    assert "Traceback" not in running.stderr()


def protocol(path: str) -> str:
    route = path.split("?")[0]
    return next(name for name in ("chat", "responses", "messages") if route.endswith(ROUTES[name]))


ROUTES = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}


def capped(kind: str, body: dict, cap: int) -> dict:
    """The body with its token budget at most `cap`: lowered where it is higher, set where there is none and the
    server's default (TEXT_CAP) is not the cap. Nothing else is changed."""
    body = dict(body)
    fields = [f for f in BUDGET[kind] if f in body] or ([BUDGET[kind][-1]] if cap != TEXT_CAP else [])
    for field in fields:
        body[field] = min(body.get(field) or cap, cap)
    return body


def sse(payload: bytes) -> list[tuple[str | None, str]]:
    """(event name or None, data) for each server-sent event."""
    events = []
    for block in payload.decode().replace("\r\n", "\n").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":"))
        if "data" in fields:
            events.append((fields.get("event"), fields["data"]))
    return events


def chat_answer(payload: bytes, stream: bool) -> tuple[str, list[tuple[str, str]], bool]:
    """(text, [(tool name, arguments JSON)], finished: not cut by the budget) of a chat completion or of its chunks,
    checking their shape."""
    if not stream:
        reply = json.loads(payload)
        assert reply["object"] == "chat.completion" and reply["choices"][0]["finish_reason"]
        message, finish = reply["choices"][0]["message"], reply["choices"][0]["finish_reason"]
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
        return message.get("content") or "", calls, finish != "length"
    events = [data for _, data in sse(payload)]
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(data) for data in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    [finish] = [choice["finish_reason"] for c in chunks for choice in c["choices"] if choice.get("finish_reason")]
    text, calls = "", {}
    for choice in (choice for c in chunks for choice in c["choices"]):
        text += choice["delta"].get("content") or ""
        for call in choice["delta"].get("tool_calls") or []:
            name, args = calls.get(call["index"], ("", ""))
            function = call.get("function") or {}
            calls[call["index"]] = (name + (function.get("name") or ""), args + (function.get("arguments") or ""))
    return text, list(calls.values()), finish != "length"


def responses_answer(payload: bytes, stream: bool) -> tuple[str, list[tuple[str, str]], bool]:
    """(text, calls) of a Responses object, or of the one a stream's terminal event carries."""
    if stream:
        events = sse(payload)
        name, data = events[-1]
        assert name in ("response.completed", "response.incomplete"), [e for e, _ in events[-3:]]
        assert json.loads(data)["type"] == name
        reply = json.loads(data)["response"]
    else:
        reply = json.loads(payload)
    assert reply["object"] == "response" and reply["status"] in ("completed", "incomplete")
    text = "".join(
        part.get("text", "") for item in reply["output"] if item["type"] == "message" for part in item["content"]
    )
    calls = [(item["name"], item["arguments"]) for item in reply["output"] if item["type"] == "function_call"]
    return text, calls, reply["status"] == "completed"


def messages_answer(payload: bytes, stream: bool) -> tuple[str, list[tuple[str, str]], bool]:
    """(text, calls, finished) of an Anthropic message, or of its events put back together."""
    if not stream:
        reply = json.loads(payload)
        assert reply["type"] == "message" and reply["role"] == "assistant" and reply["stop_reason"]
        blocks = reply["content"]
        calls = [(b["name"], json.dumps(b["input"])) for b in blocks if b["type"] == "tool_use"]
        text = "".join(b.get("text", "") for b in blocks if b["type"] == "text")
        return text, calls, reply["stop_reason"] != "max_tokens"
    events = [(name, json.loads(data)) for name, data in sse(payload)]
    assert events[0][0] == "message_start" and events[-1][0] == "message_stop", [e for e, _ in events[-3:]]
    blocks: dict[int, dict] = {}
    [stop] = [event["delta"]["stop_reason"] for name, event in events if name == "message_delta"]
    for name, event in events:
        if name == "content_block_start":
            blocks[event["index"]] = {**event["content_block"], "json": ""}
        elif name == "content_block_delta":
            delta, block = event["delta"], blocks[event["index"]]
            block["text"] = block.get("text", "") + delta.get("text", "")
            block["json"] += delta.get("partial_json", "")
    calls = [(b["name"], b["json"] or "{}") for b in blocks.values() if b["type"] == "tool_use"]
    text = "".join(b.get("text", "") for b in blocks.values() if b["type"] == "text")
    return text, calls, stop != "max_tokens"


ANSWER = {"chat": chat_answer, "responses": responses_answer, "messages": messages_answer}


@pytest.mark.parametrize("case", CASES, ids=[p.stem for p in CASES])
def test_a_framework_request_is_answered_in_its_protocols_shape(server, case):
    golden = json.loads(case.read_text(encoding="utf-8"))
    kind, expect = protocol(golden["path"]), golden["expect"]
    body = capped(kind, golden["body"], JSON_CAP if expect else TEXT_CAP)
    status, headers, payload = raw(server.port, "POST", golden["path"], body, headers=golden["headers"])
    assert status == 200, payload.decode(errors="replace")[:500]
    assert headers["content-type"].startswith("text/event-stream" if golden["stream"] else "application/json")
    text, calls, finished = ANSWER[kind](payload, golden["stream"])
    if "tool_call" in expect:
        assert calls, f"no tool call; the answer was {text!r}"  # only whole calls come back, even when cut
        for name, arguments in calls:
            assert name in expect["tool_call"], (name, list(expect["tool_call"]))
            jsonschema.validate(json.loads(arguments), expect["tool_call"][name])
    if expect.get("json"):
        assert finished, f"a schema's JSON cut by {JSON_CAP} tokens: {text!r}"
        jsonschema.validate(json.loads(text), expect["json"])
    elif "json" in expect:  # JSON mode: an object, which a 135M model may not close within the budget
        assert text.startswith("{") and (not finished or isinstance(json.loads(text), dict)), text
