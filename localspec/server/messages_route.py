"""`POST /v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages API over the one engine path.

The body is translated (server/messages_api.py) into the chat route's `request.Request` and run by `flow`, so
speculation, the tool-call syntax and its grammar, and the thinking split are the chat route's. The answer is
written back as Anthropic's message — thinking, text and `tool_use` blocks, `stop_reason`, `usage` — or as its event
stream (`message_start`, `ping`, `content_block_start` / `_delta` / `_stop`, `message_delta`, `message_stop`). The
speculation stats ride in the extension keys `timings` and `localspec`: on the message, and on the stream's
`message_delta`.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from localspec.core.engine import Generation
from localspec.core.thinking import THINKING, ThinkingSplit

from . import flow
from . import request as request_mod
from .api import ApiError, parse_body
from .messages_api import IGNORED, CountRequest, MessagesRequest, error_body
from .render import Reply, usage_and_timings
from .runner import Runner


def routes(runner: Runner, max_body: int, read_body, event_stream) -> list[tuple[str, object, list[str]]]:
    """(path, handler, methods) of the Messages routes; `read_body` and `event_stream` are the app's."""

    async def messages(http: HttpRequest) -> Response:
        parsed = parse_body(await read_body(http, max_body), MessagesRequest, unsupported={}, ignored=IGNORED)
        request = parsed.to_request()
        if not parsed.stream:
            outcome = await flow.whole(http, runner, parsed.model, request)
            token_bytes = outcome.served.engine.target_model.token_bytes
            reply = Reply("chat", outcome.served.name, tools=outcome.tools, token_bytes=token_bytes)
            body = message(reply, outcome.prompt_tokens, outcome.generations, outcome.splits, request.stop)
            return JSONResponse(body)
        first, queue, job = await flow.streamed(http, runner, parsed.model, request)
        reply = Reply("chat", first.model, tools=first.tools, token_bytes=first.token_bytes)
        return event_stream(_events(queue, reply, first.prompt_tokens, request.stop), job.cancel)

    async def count_tokens(http: HttpRequest) -> Response:
        parsed = parse_body(await read_body(http, max_body), CountRequest, unsupported={}, ignored=IGNORED)
        outcome = await flow.whole(http, runner, parsed.model, parsed.to_request())
        return JSONResponse({"input_tokens": outcome.prompt_tokens})

    return [("/v1/messages", messages, ["POST"]), ("/v1/messages/count_tokens", count_tokens, ["POST"])]


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def stop_reason(reply: Reply, gen: Generation, split: ThinkingSplit | None, stop: tuple[str, ...]):
    """(Anthropic's stop_reason, the stop sequence that ended the answer or None)."""
    if reply.finish(gen, split) == "tool_calls":
        return "tool_use", None
    if gen.finish_reason == "length":
        return "max_tokens", None
    if gen.finish_reason == "stop" and stop and reply.token_bytes is not None:
        said = b"".join(reply.token_bytes(t) for t in gen.tokens).decode("utf-8", errors="replace")
        found = [(said.find(s), s) for s in stop if s in said]
        if found:
            return "stop_sequence", min(found)[1]
    return "end_turn", None


def _usage(prompt_tokens: int, generations, splits) -> tuple[dict, dict]:
    both = usage_and_timings(prompt_tokens, generations, splits)
    cached = both["usage"]["prompt_tokens_details"]["cached_tokens"]
    usage = {
        "input_tokens": prompt_tokens - cached,
        "output_tokens": both["usage"]["completion_tokens"],
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }
    return usage, {"timings": both["timings"], "localspec": both["localspec"]}


def _tool_use(call: dict) -> dict:
    arguments = json.loads(call["function"]["arguments"] or "{}")
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": arguments}


def message(reply: Reply, prompt_tokens: int, generations, splits, stop: tuple[str, ...]) -> dict:
    """The whole answer as Anthropic's message object (one choice: the Messages API has no `n`)."""
    gen, split = generations[0], splits[0] if splits else None
    content: list[dict] = []
    if split is not None and split.reasoning:
        content.append({"type": "thinking", "thinking": split.reasoning, "signature": ""})
    text, calls = reply.calls(0, gen, split)
    if text:
        content.append({"type": "text", "text": text})
    content += [_tool_use(c) for c in calls]
    reason, sequence = stop_reason(reply, gen, split, stop)
    usage, extra = _usage(prompt_tokens, generations, splits)
    return {
        "id": _id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage,
        **extra,
    }


def _event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n".encode()


class _Blocks:
    """The content blocks of a streamed message: each opened once, in order, and closed before the next."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None

    def start(self, block: dict) -> list[bytes]:
        out = self.stop()
        self.index += 1
        self.open = block["type"]
        return [*out, _event("content_block_start", {"index": self.index, "content_block": block})]

    def delta(self, delta: dict) -> bytes:
        return _event("content_block_delta", {"index": self.index, "delta": delta})

    def stop(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [_event("content_block_stop", {"index": self.index})]


async def _events(
    queue: asyncio.Queue, reply: Reply, prompt_tokens: int, stop: tuple[str, ...]
) -> AsyncIterator[bytes]:
    head = {"id": _id("msg_"), "type": "message", "role": "assistant", "model": reply.model, "content": []}
    head |= {"stop_reason": None, "stop_sequence": None}
    head["usage"] = {"input_tokens": prompt_tokens, "output_tokens": 0}
    yield _event("message_start", {"message": head})
    yield _event("ping", {})
    blocks = _Blocks()
    while True:
        item = await queue.get()
        if isinstance(item, request_mod.Token):
            for part, text, _ in item.pieces:
                kind = "thinking" if part == THINKING else "text"
                if kind == "text" and reply.tools is not None:
                    continue  # with tools the answer is parsed when it ends
                if blocks.open != kind:
                    block = {"type": kind, kind: ""} | ({"signature": ""} if kind == "thinking" else {})
                    for chunk in blocks.start(block):
                        yield chunk
                yield blocks.delta({"type": f"{kind}_delta", kind: text})
        elif isinstance(item, request_mod.Ended):
            if reply.tools is not None:
                text, calls = reply.calls(0, item.generation, item.split)
                if text:
                    for chunk in blocks.start({"type": "text", "text": ""}):
                        yield chunk
                    yield blocks.delta({"type": "text_delta", "text": text})
                for call in calls:
                    use = _tool_use(call)
                    for chunk in blocks.start({**use, "input": {}}):
                        yield chunk
                    yield blocks.delta({"type": "input_json_delta", "partial_json": json.dumps(use["input"])})
            for chunk in blocks.stop():
                yield chunk
            reason, sequence = stop_reason(reply, item.generation, item.split, stop)
            usage, extra = _usage(prompt_tokens, [item.generation], [item.split])
            delta = {"stop_reason": reason, "stop_sequence": sequence}
            yield _event("message_delta", {"delta": delta, "usage": {"output_tokens": usage["output_tokens"]}, **extra})
        elif isinstance(item, request_mod.Done):
            error = item.future.exception()
            if error is not None:
                api = error if isinstance(error, ApiError) else ApiError(500, str(error), "server_error")
                yield _event("error", {"error": error_body(api)["error"]})
                return
            yield _event("message_stop", {})
            return
