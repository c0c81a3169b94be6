"""`POST /v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages API over the one engine path.

The body is translated (server/messages_api.py) into the chat route's `request.Request` and run by `flow`, so
speculation, the tool-call syntax and its grammar, and the thinking split are the chat route's. The neutral `Answer`
(server/answer.py) is written by the two encoders here: `message`, Anthropic's message — thinking, text and
`tool_use` blocks, `stop_reason`, `usage` — and `message_stream`, its events (`message_start`, `ping`,
`content_block_start` / `_delta` / `_stop`, `message_delta`, `message_stop`). The speculation stats ride in the
extension keys `timings` and `localspec`: on the message, and on the stream's `message_delta`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from localspec.core.thinking import THINKING

from . import flow
from .answer import Answer, Choice, Delta, Event, Failure
from .api import ApiError, parse_body
from .images import ImageReader, translated
from .messages_api import IGNORED, CountRequest, MessagesRequest, error_body
from .pairs import Pairs


def routes(
    router: Pairs, max_body: int, read_body, event_stream, images: ImageReader
) -> list[tuple[str, object, list[str]]]:
    """(path, handler, methods) of the Messages routes; `read_body` and `event_stream` are the app's, `images` reads
    a turn's images."""

    async def messages(http: HttpRequest) -> Response:
        parsed = parse_body(await read_body(http, max_body), MessagesRequest, unsupported={}, ignored=IGNORED)
        request = await translated(images, parsed.to_request)
        if not parsed.stream:
            return JSONResponse(message(await flow.whole(http, router, parsed.model, request), request.stop))
        stream = await flow.streamed(http, router, parsed.model, request)
        return event_stream(message_stream(stream.answer, stream.events(), request.stop), stream.job.cancel)

    async def count_tokens(http: HttpRequest) -> Response:
        parsed = parse_body(await read_body(http, max_body), CountRequest, unsupported={}, ignored=IGNORED)
        answer = await flow.whole(http, router, parsed.model, await translated(images, parsed.to_request))
        return JSONResponse({"input_tokens": answer.prompt_tokens})

    return [("/v1/messages", messages, ["POST"]), ("/v1/messages/count_tokens", count_tokens, ["POST"])]


def message(answer: Answer, stop: tuple[str, ...]) -> dict:
    """The whole answer as Anthropic's message object (one choice: the Messages API has no `n`)."""
    if not answer.choices:
        raise ApiError(499, "the request was cancelled", code="cancelled")
    choice = answer.choices[0]
    content: list[dict] = []
    if choice.reasoning:
        content.append({"type": "thinking", "thinking": choice.reasoning, "signature": ""})
    if choice.text:
        content.append({"type": "text", "text": choice.text})
    content += [_tool_use(c) for c in choice.calls]
    reason, sequence = stop_reason(answer, choice, stop)
    return {
        "id": _id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": answer.model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": _usage(answer),
        **answer.stats(),
    }


async def message_stream(answer: Answer, events: AsyncIterator[Event], stop: tuple[str, ...]) -> AsyncIterator[bytes]:
    """The answer as Anthropic's event stream: `message_start`, `ping`, each content block's start, deltas and stop,
    `message_delta` (the stop reason, the usage and our stats), `message_stop` — or `error` where it failed."""
    head = {"id": _id("msg_"), "type": "message", "role": "assistant", "model": answer.model, "content": []}
    head |= {"stop_reason": None, "stop_sequence": None}
    head["usage"] = {"input_tokens": answer.prompt_tokens, "output_tokens": 0}
    yield _event("message_start", {"message": head})
    yield _event("ping", {})
    blocks = _Blocks()
    async for event in events:
        if isinstance(event, Delta):
            chunks = blocks.pieces(event, tools=answer.tools is not None)
        elif isinstance(event, Choice):
            chunks = blocks.end(answer, event, stop)
        else:
            assert isinstance(event, Failure)
            yield _event("error", {"error": error_body(event.error)["error"]})
            return
        for chunk in chunks:
            yield chunk
    yield _event("message_stop", {})


def stop_reason(answer: Answer, choice: Choice, stop: tuple[str, ...]) -> tuple[str, str | None]:
    """(Anthropic's stop_reason, the stop sequence that ended the answer or None)."""
    if choice.finish == "tool_calls":
        return "tool_use", None
    if choice.finish == "length":
        return "max_tokens", None
    if choice.finish == "stop" and stop and answer.token_bytes is not None:
        said = answer.said(choice)
        found = [(said.find(s), s) for s in stop if s in said]
        if found:
            return "stop_sequence", min(found)[1]
    return "end_turn", None


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def _usage(answer: Answer) -> dict:
    u = answer.usage()
    return {
        "input_tokens": u.prompt_tokens - u.cached_tokens,
        "output_tokens": u.completion_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def _tool_use(call: dict) -> dict:
    arguments = json.loads(call["function"]["arguments"] or "{}")
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": arguments}


def _event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n".encode()


class _Blocks:
    """The content blocks of a streamed message: each opened once, in order, and closed before the next."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None

    def pieces(self, delta: Delta, tools: bool) -> Iterator[bytes]:
        """A token's text: thinking and text blocks (with tools the answer waits to be parsed at its end)."""
        for part, text, _ in delta.pieces:
            kind = "thinking" if part == THINKING else "text"
            if kind == "text" and tools:
                continue
            if self.open != kind:
                yield from self.start({"type": kind, kind: ""} | ({"signature": ""} if kind == "thinking" else {}))
            yield self.delta({"type": f"{kind}_delta", kind: text})

    def end(self, answer: Answer, choice: Choice, stop: tuple[str, ...]) -> Iterator[bytes]:
        """The answer's end: its text and `tool_use` blocks where tools were offered, then `message_delta`."""
        if answer.tools is not None:
            if choice.text:
                yield from self.start({"type": "text", "text": ""})
                yield self.delta({"type": "text_delta", "text": choice.text})
            for call in choice.calls:
                use = _tool_use(call)
                yield from self.start({**use, "input": {}})
                yield self.delta({"type": "input_json_delta", "partial_json": json.dumps(use["input"])})
        yield from self.stop()
        reason, sequence = stop_reason(answer, choice, stop)
        usage = {"output_tokens": _usage(answer)["output_tokens"]}
        yield _event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage,
                                       **answer.stats()})  # fmt: skip

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
