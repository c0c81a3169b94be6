"""Record what six client frameworks really send, as the golden requests tests/server/test_golden_requests.py replays.

A stub server on 127.0.0.1 records every request (path, JSON body, the headers that matter, never a key) and answers
the protocol's smallest valid reply — chat completion, Responses object, Anthropic message, streamed or whole, with
the forced tool's call or JSON that fits the requested schema — so each framework's call completes. Each framework is
driven through its flows at model "demo"; each request becomes tests/server/golden/<framework>-<flow>[-<n>].json.
Nothing here imports localspec. The frameworks are heavy and one pins what another cannot use, so rerun it from two
venvs outside this repository (never the project's .venv):

    python3 -m venv /tmp/fw && /tmp/fw/bin/pip install openai-agents pydantic-ai langchain-openai llm litellm \
        "anthropic<1"   # pydantic-ai 2.31's Anthropic model fails on anthropic 1.x and 2.x (checked: 0.125 works)
    python3 -m venv /tmp/fw-instructor && /tmp/fw-instructor/bin/pip install instructor anthropic
    /tmp/fw/bin/python scripts/record_golden_requests.py openai-agents pydantic-ai langchain-openai llm litellm
    /tmp/fw-instructor/bin/python scripts/record_golden_requests.py instructor

A framework's old files are deleted before its new ones are written; review the diff before committing it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "server" / "golden"
KEPT_HEADERS = ("content-type", "accept", "anthropic-version", "anthropic-beta", "openai-beta")
PROMPT = "Say hello in one word."
WEATHER_PROMPT = "What is the weather in Paris? Use the tool."
CITY_PROMPT = "Name a city and its country."
log = logging.getLogger("record")


# ---------------------------------------------------------------- what the stub answers


def example(schema: dict, root: dict | None = None) -> object:
    """A small value that fits `schema` (the subset frameworks generate: $ref, anyOf, enum, const, the six types)."""
    root = schema if root is None else root
    if "$ref" in schema:
        target = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return example(target, root)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return example(options[0], root)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        return {name: example(sub, root) for name, sub in schema.get("properties", {}).items()}
    if kind == "array":
        return [example(schema.get("items", {}), root) for _ in range(max(1, schema.get("minItems", 1)))]
    simple = {"string": "Paris", "integer": 1, "number": 1.0, "boolean": True, "null": None}
    return simple.get(kind, "Paris")


def offered_tools(path: str, body: dict) -> dict[str, dict]:
    """Tool name → its parameters' schema, for each protocol's way of offering function tools."""
    tools = {}
    for tool in body.get("tools") or []:
        if "/messages" in path and "name" in tool:
            tools[tool["name"]] = tool.get("input_schema", {})
        elif tool.get("type") == "function" and "function" in tool:
            tools[tool["function"]["name"]] = tool["function"].get("parameters", {})
        elif tool.get("type") == "function":
            tools[tool["name"]] = tool.get("parameters", {})
    return tools


def forced_tool(path: str, body: dict) -> str | None:
    """The tool a request forces: its name, "*" for any of the offered ones, None when the model may answer text."""
    choice = body.get("tool_choice")
    if choice in ("required", "any"):
        return "*"
    if isinstance(choice, dict):
        if choice.get("type") in ("any",) or choice.get("type") == "required":
            return "*"
        name = choice.get("name") or (choice.get("function") or {}).get("name")
        return name
    return None


def has_tool_result(path: str, body: dict) -> bool:
    """Whether the conversation already carries a tool's result (the turn after the call)."""
    if "/chat/completions" in path:
        return any(m.get("role") == "tool" for m in body.get("messages", []))
    if "/responses" in path:
        items = body.get("input")
        return isinstance(items, list) and any(i.get("type") == "function_call_output" for i in items)
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, list) and any(b.get("type") == "tool_result" for b in content):
            return True
    return False


def requested_schema(path: str, body: dict) -> dict | None:
    """The JSON schema a request asks the answer's text to follow ({} for plain JSON mode), else None."""
    if "/chat/completions" in path:
        fmt = body.get("response_format") or {}
    elif "/responses" in path:
        fmt = (body.get("text") or {}).get("format") or {}
    else:
        fmt = (body.get("output_config") or {}).get("format") or body.get("output_format") or {}
    if fmt.get("type") == "json_schema":
        return fmt.get("json_schema", fmt).get("schema", {})
    if fmt.get("type") == "json_object":
        return {}
    return None


def plan(path: str, body: dict) -> tuple[str, str, str]:
    """What the stub answers: ("tool", name, arguments JSON) or ("text", "", text)."""
    tools = offered_tools(path, body)
    if tools and not has_tool_result(path, body) and body.get("tool_choice") != "none":
        name = forced_tool(path, body)
        name = name if name in tools else next(iter(tools))
        return "tool", name, json.dumps(example(tools[name]))
    schema = requested_schema(path, body)
    if schema:
        return "text", "", json.dumps(example(schema))
    if CITY_PROMPT in json.dumps(body):  # JSON mode, the schema in the prompt: what instructor will parse
        return "text", "", json.dumps({"city": "Paris", "country": "France"})
    return "text", "", "Hello."


USAGE_CHAT = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
USAGE_RESPONSES = {
    "input_tokens": 5,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 3,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 8,
}


def sse(events: list[dict], named: bool, done: bool = False) -> bytes:
    """Server-sent events: `event: <type>` lines where the protocol names them, then `data: [DONE]` for chat."""
    lines = []
    for event in events:
        head = f"event: {event['type']}\n" if named else ""
        lines.append(f"{head}data: {json.dumps(event)}\n\n")
    if done:
        lines.append("data: [DONE]\n\n")
    return "".join(lines).encode()


def chat_reply(body: dict, kind: str, name: str, text: str) -> bytes:
    """A chat completion, or its chunks, carrying `text` or one call of `name`."""
    head = {"id": "chatcmpl-rec", "created": 0, "model": body.get("model", "demo"), "system_fingerprint": None}
    call = {"id": "call_rec", "type": "function", "function": {"name": name, "arguments": text}}
    finish = "tool_calls" if kind == "tool" else "stop"
    if not body.get("stream"):
        message = {"role": "assistant", "content": None if kind == "tool" else text, "refusal": None}
        if kind == "tool":
            message["tool_calls"] = [call]
        choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        return json.dumps({**head, "object": "chat.completion", "choices": [choice], "usage": USAGE_CHAT}).encode()
    chunk = {**head, "object": "chat.completion.chunk"}
    delta = {"tool_calls": [{"index": 0, **call}]} if kind == "tool" else {"content": text}
    chunks = [
        {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
    ]
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append({**chunk, "choices": [], "usage": USAGE_CHAT})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"


def responses_reply(body: dict, kind: str, name: str, text: str) -> bytes:
    """A Responses object, or its event stream, whose one output item is `text` or a call of `name`."""
    if kind == "tool":
        item = {"type": "function_call", "id": "fc_rec", "call_id": "call_rec", "name": name, "arguments": text}
    else:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        item = {"type": "message", "id": "msg_rec", "role": "assistant", "content": [part]}
    item["status"] = "completed"
    response = {
        "id": "resp_rec", "object": "response", "created_at": 0, "model": body.get("model", "demo"),
        "status": "completed", "output": [item], "usage": USAGE_RESPONSES, "error": None,
        "incomplete_details": None, "instructions": body.get("instructions"), "metadata": {},
        "parallel_tool_calls": True, "temperature": None, "top_p": None, "tool_choice": "auto", "tools": [],
        "text": body.get("text") or {"format": {"type": "text"}}, "truncation": "disabled", "store": False,
    }  # fmt: skip
    if not body.get("stream"):
        return json.dumps(response).encode()
    start = {**response, "status": "in_progress", "output": [], "usage": None}
    events = [{"type": "response.created", "response": start}, {"type": "response.in_progress", "response": start}]
    events.append({"type": "response.output_item.added", "output_index": 0, "item": {**item, "status": "in_progress"}})
    if kind == "tool":
        at = {"item_id": "fc_rec", "output_index": 0}
        events.append({"type": "response.function_call_arguments.delta", **at, "delta": text})
        events.append({"type": "response.function_call_arguments.done", **at, "arguments": text, "name": name})
    else:
        at = {"item_id": "msg_rec", "output_index": 0, "content_index": 0}
        empty = {**item["content"][0], "text": ""}
        events.append({"type": "response.content_part.added", **at, "part": empty})
        events.append({"type": "response.output_text.delta", **at, "delta": text, "logprobs": []})
        events.append({"type": "response.output_text.done", **at, "text": text, "logprobs": []})
        events.append({"type": "response.content_part.done", **at, "part": item["content"][0]})
    events.append({"type": "response.output_item.done", "output_index": 0, "item": item})
    events.append({"type": "response.completed", "response": response})
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return sse(events, named=True)


def messages_reply(body: dict, kind: str, name: str, text: str) -> bytes:
    """An Anthropic message, or its event stream, whose one block is `text` or a `tool_use` of `name`."""
    if kind == "tool":
        block = {"type": "tool_use", "id": "toolu_rec", "name": name, "input": json.loads(text)}
    else:
        block = {"type": "text", "text": text}
    stop = "tool_use" if kind == "tool" else "end_turn"
    message = {
        "id": "msg_rec", "type": "message", "role": "assistant", "model": body.get("model", "demo"),
        "content": [block], "stop_reason": stop, "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 3},
    }  # fmt: skip
    if not body.get("stream"):
        return json.dumps(message).encode()
    empty = {**block, "input": {}} if kind == "tool" else {**block, "text": ""}
    delta = (
        {"type": "input_json_delta", "partial_json": text} if kind == "tool" else {"type": "text_delta", "text": text}
    )
    events = [
        {"type": "message_start", "message": {**message, "content": [], "stop_reason": None}},
        {"type": "content_block_start", "index": 0, "content_block": empty},
        {"type": "content_block_delta", "index": 0, "delta": delta},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 3}},
        {"type": "message_stop"},
    ]
    return sse(events, named=True)


def reply(path: str, body: dict) -> tuple[int, str, bytes]:
    """(status, content type, payload) for one request the stub received."""
    kind, name, text = plan(path, body)
    route = path.split("?")[0]
    if route.endswith("/chat/completions"):
        payload = chat_reply(body, kind, name, text)
    elif route.endswith("/responses"):
        payload = responses_reply(body, kind, name, text)
    elif route.endswith("/messages"):
        payload = messages_reply(body, kind, name, text)
    else:
        error = {"error": {"message": f"the recorder does not serve {path}", "type": "invalid_request_error"}}
        return 404, "application/json", json.dumps(error).encode()
    return 200, "text/event-stream" if body.get("stream") else "application/json", payload


# ---------------------------------------------------------------- the recording server


class Recorder(BaseHTTPRequestHandler):
    """Records each request on `server.records` and answers it with `reply`."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.loads(raw or b"{}")
        headers = {k.lower(): v for k, v in self.headers.items() if k.lower() in KEPT_HEADERS}
        self.server.records.append({"method": "POST", "path": self.path, "headers": headers, "body": body})
        self.answer(*reply(self.path, body))

    def do_GET(self) -> None:  # noqa: N802
        self.server.records.append({"method": "GET", "path": self.path})
        models = {"object": "list", "data": [{"id": "demo", "object": "model", "created": 0, "owned_by": "rec"}]}
        self.answer(200, "application/json", json.dumps(models).encode())

    def answer(self, status: int, content_type: str, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug(format, *args)


def start_recorder() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.records = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def expectation(path: str, body: dict) -> dict:
    """What a good answer to this request must have: the forced tool's call (name → its arguments' schema), or
    text that parses as JSON (against the schema, {} for plain JSON mode)."""
    tools, forced = offered_tools(path, body), forced_tool(path, body)
    if tools and forced and not has_tool_result(path, body):
        return {"tool_call": tools if forced == "*" else {forced: tools.get(forced, {})}}
    schema = requested_schema(path, body)
    return {} if schema is None else {"json": schema}


def save(framework: str, version: str, flow: str, records: list[dict], seen: dict[str, str]) -> list[str]:
    """Write each POST of one flow as tests/server/golden/<framework>-<flow>[-<n>].json, but for a request the
    framework already sent in another flow (`seen`: request → its file's name): the names, written or not."""
    names = []
    posts = [r for r in records if r["method"] == "POST"]
    for n, record in enumerate(posts, 1):
        name = f"{framework}-{flow}" + (f"-{n}" if n > 1 else "")
        key = json.dumps([record["path"], record["body"]], sort_keys=True)
        if key in seen:
            names.append(f"({name}: the same request as {seen[key]})")
            continue
        seen[key] = name
        body = record["body"]
        golden = {
            "framework": framework, "version": version, "flow": flow, "path": record["path"],
            "stream": bool(body.get("stream")), "headers": record["headers"],
            "expect": expectation(record["path"], body), "body": body,
        }  # fmt: skip
        text = json.dumps(golden, indent=1, ensure_ascii=False) + "\n"
        (GOLDEN / f"{name}.json").write_text(text, encoding="utf-8")
        names.append(f"{name}.json")
    return names


# ---------------------------------------------------------------- the frameworks' flows

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"Sunny in {city}."


def city_model():
    from pydantic import BaseModel

    class City(BaseModel):
        """A city and the country it is in."""

        city: str
        country: str

    return City


def openai_agents_flows(port: int) -> dict[str, Callable[[], object]]:
    """openai-agents: its Responses model (the default) and its chat-completions model, each through a run, a
    streamed run, a required and a named tool, an output type, and the model settings a user sets."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI
    from openai.types.shared import Reasoning

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-recording", max_retries=0)
    tool = function_tool(get_weather)
    options = ModelSettings(
        temperature=0.0, top_p=0.9, max_tokens=64, reasoning=Reasoning(effort="low"), verbosity="low",
        truncation="auto", prompt_cache_retention="24h", store=False, include_usage=True,
    )  # fmt: skip

    async def streamed(agent, prompt):
        result = Runner.run_streamed(agent, prompt)
        async for _ in result.stream_events():
            pass

    flows = {}
    for api, model_type in (("responses", OpenAIResponsesModel), ("chat", OpenAIChatCompletionsModel)):
        model = model_type(model="demo", openai_client=client)

        def agent(model=model, **kw):
            return Agent(name="assistant", instructions="Answer briefly.", model=model, **kw)

        flows |= {
            f"{api}-text": lambda a=agent: Runner.run(a(), PROMPT),
            f"{api}-stream": lambda a=agent: streamed(a(), PROMPT),
            f"{api}-tool-required": lambda a=agent: Runner.run(
                a(tools=[tool], model_settings=ModelSettings(tool_choice="required")), WEATHER_PROMPT
            ),
            f"{api}-tool-named": lambda a=agent: Runner.run(
                a(tools=[tool], model_settings=ModelSettings(tool_choice="get_weather")), WEATHER_PROMPT
            ),
            f"{api}-output-type": lambda a=agent: Runner.run(a(output_type=city_model()), CITY_PROMPT),
            f"{api}-options": lambda a=agent: Runner.run(a(model_settings=options), PROMPT),
        }
    return flows


def pydantic_ai_flows(port: int) -> dict[str, Callable[[], object]]:
    """pydantic-ai: its OpenAI chat, OpenAI Responses and Anthropic models, each through a run, a streamed run, a
    structured output (its default output tool, and NativeOutput's response format), a tool round trip, and settings."""
    from anthropic import AsyncAnthropic
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.anthropic import AnthropicModel, AnthropicModelSettings
    from pydantic_ai.models.openai import (
        OpenAIChatModel,
        OpenAIChatModelSettings,
        OpenAIResponsesModel,
        OpenAIResponsesModelSettings,
    )
    from pydantic_ai.providers.anthropic import AnthropicProvider
    from pydantic_ai.providers.openai import OpenAIProvider

    openai = OpenAIProvider(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-recording")
    # its own httpx client is refused by anthropic 2.x (httpx2): hand it the SDK's client, as its docs allow
    claude = AsyncAnthropic(base_url=f"http://127.0.0.1:{port}", api_key="sk-recording", max_retries=0)
    anthropic = AnthropicProvider(anthropic_client=claude)
    common = {"temperature": 0.0, "max_tokens": 64, "top_p": 0.9}
    models = {
        "chat": (OpenAIChatModel("demo", provider=openai), OpenAIChatModelSettings(
            **common, seed=1, openai_reasoning_effort="low", openai_prompt_cache_key="golden")),
        "responses": (OpenAIResponsesModel("demo", provider=openai), OpenAIResponsesModelSettings(
            **common, openai_reasoning_effort="low", openai_text_verbosity="low", openai_truncation="auto")),
        "messages": (AnthropicModel("demo", provider=anthropic), AnthropicModelSettings(
            temperature=0.0, max_tokens=64, stop_sequences=["\n\n"])),
    }  # fmt: skip

    async def streamed(agent):
        async with agent.run_stream(PROMPT) as result:
            async for _ in result.stream_text():
                pass

    flows = {}
    for api, (model, settings) in models.items():
        flows |= {
            f"{api}-text": lambda m=model: Agent(m, instructions="Answer briefly.").run(PROMPT),
            f"{api}-stream": lambda m=model: streamed(Agent(m)),
            f"{api}-tool-output": lambda m=model: Agent(m, output_type=city_model()).run(CITY_PROMPT),
            f"{api}-native-output": lambda m=model: Agent(m, output_type=NativeOutput(city_model())).run(CITY_PROMPT),
            f"{api}-tool": lambda m=model: Agent(m, tools=[get_weather]).run(WEATHER_PROMPT),
            f"{api}-options": lambda m=model, s=settings: Agent(m, model_settings=s).run(PROMPT),
        }
    del flows["messages-native-output"]  # Anthropic's native output needs a model profile that has it
    return flows


def instructor_flows(port: int) -> dict[str, Callable[[], object]]:
    """instructor: a response model through its modes (TOOLS, the default: a named tool; TOOLS_STRICT; JSON_SCHEMA;
    JSON; RESPONSES_TOOLS; Anthropic's tools and JSON), streamed partials, and the sampling options a user sets."""
    import instructor
    from anthropic import Anthropic
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-recording", max_retries=0)
    claude = Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="sk-recording", max_retries=0)
    ask = [{"role": "user", "content": CITY_PROMPT}]
    Mode = instructor.Mode

    def create(mode, **kw):
        patched = instructor.from_openai(client, mode=mode)
        return patched.chat.completions.create(model="demo", messages=ask, response_model=city_model(), **kw)

    def create_claude(mode):
        patched = instructor.from_anthropic(claude, mode=mode)
        return patched.messages.create(model="demo", max_tokens=256, messages=ask, response_model=city_model())

    def partial():
        patched = instructor.from_openai(client)
        for _ in patched.chat.completions.create_partial(model="demo", messages=ask, response_model=city_model()):
            pass

    return {
        "chat-tools": lambda: create(Mode.TOOLS),
        "chat-tools-strict": lambda: create(Mode.TOOLS_STRICT),
        "chat-tools-stream": partial,
        "chat-json-schema": lambda: create(Mode.JSON_SCHEMA),
        "chat-json": lambda: create(Mode.JSON),
        "chat-options": lambda: create(Mode.TOOLS, temperature=0.0, max_tokens=64, seed=1, top_p=0.9),
        "responses-tools": lambda: create(Mode.RESPONSES_TOOLS),
        "messages-tools": lambda: create_claude(Mode.ANTHROPIC_TOOLS),
        "messages-json": lambda: create_claude(Mode.ANTHROPIC_JSON),
    }


def langchain_openai_flows(port: int) -> dict[str, Callable[[], object]]:
    """langchain-openai's ChatOpenAI on chat completions and on the Responses API: invoke, stream, a required and a
    named tool, structured output (json_schema, its default, and function_calling), and the fields a user sets."""
    from langchain_openai import ChatOpenAI

    def chat(**kw):
        base = {"model": "demo", "base_url": f"http://127.0.0.1:{port}/v1", "api_key": "sk-recording"}
        return ChatOpenAI(**base, max_retries=0, **kw)

    options = {"temperature": 0.0, "max_tokens": 64, "top_p": 0.9, "reasoning_effort": "low", "verbosity": "low"}
    flows = {}
    for api, extra, more in (
        ("chat", {}, {"seed": 1}),
        ("responses", {"use_responses_api": True}, {"truncation": "auto", "store": False}),
    ):
        flows |= {
            f"{api}-text": lambda e=extra: chat(**e).invoke(PROMPT),
            f"{api}-stream": lambda e=extra: list(chat(**e).stream(PROMPT)),
            f"{api}-tool-required": lambda e=extra: (
                chat(**e).bind_tools([get_weather], tool_choice="any").invoke(WEATHER_PROMPT)
            ),
            f"{api}-tool-named": lambda e=extra: (
                chat(**e).bind_tools([get_weather], tool_choice="get_weather").invoke(WEATHER_PROMPT)
            ),
            f"{api}-structured": lambda e=extra: chat(**e).with_structured_output(city_model()).invoke(CITY_PROMPT),
            f"{api}-structured-tool": lambda e=extra: (
                chat(**e).with_structured_output(city_model(), method="function_calling").invoke(CITY_PROMPT)
            ),
            f"{api}-options": lambda e=extra, m=more: chat(**e, **options, **m).invoke(PROMPT),
        }
    return flows


def llm_flows(port: int) -> dict[str, Callable[[], object]]:
    """simonw's `llm`, its OpenAI-compatible models from extra-openai-models.yaml (chat, and `responses: true`):
    a prompt, a stream, `--schema "city, country"`, a tool chain, a continued conversation, and `-o` options."""
    user_dir = Path(tempfile.mkdtemp(prefix="llm-user-"))
    os.environ["LLM_USER_PATH"] = str(user_dir)
    base = f"http://127.0.0.1:{port}/v1"
    entries = []
    for model_id, extra in (
        ("localspec", ""),
        ("localspec-responses", "  responses: true\n"),
        ("localspec-reasoning", "  reasoning: true\n"),  # what a user adds to set -o reasoning_effort
        ("localspec-responses-reasoning", "  responses: true\n  reasoning: true\n"),
    ):
        entries.append(
            f"- model_id: {model_id}\n  model_name: demo\n  api_base: {base}\n  supports_schema: true\n"
            f"  supports_tools: true\n{extra}"
        )
    (user_dir / "extra-openai-models.yaml").write_text("".join(entries), encoding="utf-8")
    import llm

    def continued(model):
        conversation = model.conversation()
        conversation.prompt(PROMPT, stream=False).text()
        return conversation.prompt("And in French?", stream=False).text()

    flows = {}
    for api, model_id in (("chat", "localspec"), ("responses", "localspec-responses")):
        model = llm.get_model(model_id)
        flows |= {
            f"{api}-text": lambda m=model: m.prompt(PROMPT, stream=False).text(),
            f"{api}-stream": lambda m=model: "".join(m.prompt(PROMPT)),
            f"{api}-schema": lambda m=model: m.prompt(
                CITY_PROMPT, schema=llm.schema_dsl("city, country"), stream=False
            ).text(),
            f"{api}-tool": lambda m=model: m.chain(WEATHER_PROMPT, tools=[get_weather], stream=False).text(),
            f"{api}-continue": lambda m=model: continued(m),
            f"{api}-options": lambda i=model_id: (
                llm.get_model(f"{i}-reasoning")
                .prompt(PROMPT, stream=False, temperature=0.0, max_tokens=64, top_p=0.9, reasoning_effort="low")
                .text()
            ),
        }
    flows["chat-options-seed"] = lambda: llm.get_model("localspec").prompt(PROMPT, stream=False, seed=1).text()
    return flows


def litellm_flows(port: int) -> dict[str, Callable[[], object]]:
    """litellm: `completion` on an OpenAI-compatible base (chat) and on Anthropic's (Messages), and `responses`:
    a call, a stream, a required and a named tool, a response_format, and the options a user sets."""
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no fetch of the price list at import
    import litellm

    openai = {"model": "openai/demo", "api_base": f"http://127.0.0.1:{port}/v1", "api_key": "sk-recording"}
    claude = {"model": "anthropic/demo", "api_base": f"http://127.0.0.1:{port}", "api_key": "sk-recording"}
    hi, weather = [{"role": "user", "content": PROMPT}], [{"role": "user", "content": WEATHER_PROMPT}]
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": WEATHER_SCHEMA},
    }
    named = {"type": "function", "function": {"name": "get_weather"}}
    city = [{"role": "user", "content": CITY_PROMPT}]
    sampling = {"temperature": 0.0, "max_tokens": 64, "top_p": 0.9}
    # litellm refuses seed and reasoning_effort for an Anthropic model it does not know: stop sequences instead
    options = {"chat": {**sampling, "seed": 1, "reasoning_effort": "low"}, "messages": {**sampling, "stop": ["\n\n"]}}
    flows = {}
    for api, kw in (("chat", openai), ("messages", claude)):
        flows |= {
            f"{api}-text": lambda k=kw: litellm.completion(messages=hi, **k),
            f"{api}-stream": lambda k=kw: list(litellm.completion(messages=hi, stream=True, **k)),
            f"{api}-tool-required": lambda k=kw: litellm.completion(
                messages=weather, tools=[tool], tool_choice="required", **k
            ),
            f"{api}-tool-named": lambda k=kw: litellm.completion(
                messages=weather, tools=[tool], tool_choice=named, **k
            ),
            f"{api}-schema": lambda k=kw: litellm.completion(messages=city, response_format=city_model(), **k),
            f"{api}-options": lambda k=kw, o=options[api]: litellm.completion(messages=hi, **o, **k),
        }
    flows |= {
        "responses-text": lambda: litellm.responses(input=PROMPT, **openai),
        "responses-stream": lambda: list(litellm.responses(input=PROMPT, stream=True, **openai)),
        "responses-tool-required": lambda: litellm.responses(
            input=WEATHER_PROMPT,
            tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA}],
            tool_choice="required",
            **openai,
        ),  # fmt: skip
        "responses-options": lambda: litellm.responses(
            input=PROMPT, temperature=0.0, max_output_tokens=64, reasoning={"effort": "low"}, **openai
        ),
    }
    return flows


FRAMEWORKS = {
    "openai-agents": ("openai-agents", openai_agents_flows),
    "pydantic-ai": ("pydantic-ai-slim", pydantic_ai_flows),
    "instructor": ("instructor", instructor_flows),
    "langchain-openai": ("langchain-openai", langchain_openai_flows),
    "llm": ("llm", llm_flows),
    "litellm": ("litellm", litellm_flows),
}


def record(framework: str, server: ThreadingHTTPServer, loop: asyncio.AbstractEventLoop) -> int:
    """Drive one framework through its flows, replacing its golden files; the number of flows that failed."""
    package, flows_of = FRAMEWORKS[framework]
    version = importlib.metadata.version(package)
    for old in GOLDEN.glob(f"{framework}-*.json"):
        old.unlink()
    failed, seen = 0, {}
    for flow, run in flows_of(server.server_address[1]).items():
        server.records.clear()
        try:
            result = run()
            if asyncio.iscoroutine(result):
                loop.run_until_complete(result)
        except Exception as exc:  # a flow the framework could not finish: say so, keep what it sent
            failed += 1
            log.error("%s %s: %s: %s", framework, flow, type(exc).__name__, str(exc).splitlines()[0][:300])
        names = save(framework, version, flow, list(server.records), seen)
        log.info("%s %s %s: %s", framework, version, flow, ", ".join(names) or "no request")
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("frameworks", nargs="*", help=f"any of {', '.join(FRAMEWORKS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = set(args.frameworks) - set(FRAMEWORKS)
    if unknown:
        parser.error(f"unknown framework {', '.join(sorted(unknown))}: use any of {', '.join(FRAMEWORKS)}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("httpx", "LiteLLM", "openai", "anthropic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    GOLDEN.mkdir(parents=True, exist_ok=True)
    server = start_recorder()
    loop = asyncio.new_event_loop()
    failed = 0
    try:
        for framework in args.frameworks or FRAMEWORKS:
            failed += record(framework, server, loop)
    finally:
        server.shutdown()
    if failed:
        log.error("%d flows did not finish (their requests were kept): look at each message above", failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
