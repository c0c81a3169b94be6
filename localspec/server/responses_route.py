"""`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`: OpenAI's Responses API over the one engine path.

The body is translated (server/responses_api.py) into the chat route's `request.Request` — after the stored
conversation of `previous_response_id` — and run by `flow`. The neutral `Answer` (server/answer.py) is written by
`_Response` here as a response object whose
`output` holds a `reasoning` item (a thinking model's thinking), a `message` item and `function_call` items, or as
the Responses event stream (`response.created`, `response.in_progress`, `response.output_item.added`,
`response.content_part.added`, `response.output_text.delta`, `response.reasoning_text.delta`,
`response.function_call_arguments.delta`, the matching `.done` events, then `response.completed` or
`response.incomplete`). The speculation stats ride in the extension keys `timings` and `localspec` of the response
object. A response is stored unless `store: false` (server/store.py); a stream its client leaves is stored as
`cancelled`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from localspec.core.session import Message
from localspec.core.thinking import THINKING

from . import flow
from .answer import Answer, Choice, Delta, Event, Failure
from .api import ApiError, parse_body
from .images import ImageReader, translated
from .pairs import Pairs
from .responses_api import IGNORED, UNSUPPORTED, ResponsesRequest, messages_from_json, messages_to_json
from .store import ResponseStore

log = logging.getLogger(__name__)


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def routes(
    router: Pairs, max_body: int, read_body, event_stream, images: ImageReader
) -> list[tuple[str, object, list[str]]]:
    """(path, handler, methods) of the Responses routes; `read_body` and `event_stream` are the app's, `images`
    reads an input's images."""
    store = ResponseStore(router.paths.data_dir / "responses.sqlite3")

    async def create(http: HttpRequest) -> Response:
        parsed = parse_body(await read_body(http, max_body), ResponsesRequest, unsupported=UNSUPPORTED, ignored=IGNORED)
        history: list[Message] = []
        if parsed.previous_response_id is not None:
            found = await store.get(parsed.previous_response_id)
            if found is None:
                raise ApiError(
                    400,
                    f"previous response '{parsed.previous_response_id}' was not found: it was never stored "
                    "(store: false), was deleted, or is past the store's limits",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            history = messages_from_json(found[1])
        request = await translated(images, parsed.to_request, history)
        turns = request.messages[1:] if parsed.instructions else request.messages
        response = _Response(parsed, store, list(turns or ()))
        if parsed.store:  # a store that cannot be used is said before the answer is generated, not after
            await store.check()
        if not parsed.stream:
            answer = await flow.whole(http, router, parsed.model, request)
            if not answer.choices:
                raise ApiError(499, "the request was cancelled", code="cancelled")
            return JSONResponse(await response.finish(answer, answer.choices[0]))
        stream = await flow.streamed(http, router, parsed.model, request)
        response.model = stream.answer.model

        def closed() -> None:
            stream.job.cancel()
            response.cancelled()

        return event_stream(response.events(stream.answer, stream.events()), closed)

    async def get(http: HttpRequest) -> Response:
        found = await store.get(http.path_params["id"])
        if found is None:
            raise _not_found(http.path_params["id"])
        return JSONResponse(found[0])

    async def delete(http: HttpRequest) -> Response:
        if not await store.delete(http.path_params["id"]):
            raise _not_found(http.path_params["id"])
        return JSONResponse({"id": http.path_params["id"], "object": "response.deleted", "deleted": True})

    return [
        ("/v1/responses", create, ["POST"]),
        ("/v1/responses/{id}", get, ["GET"]),
        ("/v1/responses/{id}", delete, ["DELETE"]),
    ]


_unsaved: set[asyncio.Task] = set()  # the cancelled responses being stored


def _not_found(response_id: str) -> ApiError:
    return ApiError(404, f"no stored response '{response_id}'", param="response_id", code="not_found")


class _Response:
    """One response: its object (whole or built up event by event) written from the `Answer`, its store."""

    def __init__(self, parsed: ResponsesRequest, store: ResponseStore, turns: list[Message]) -> None:
        self.parsed, self.store, self.turns = parsed, store, turns
        self.id, self.created = _id("resp_"), int(time.time())
        self.model: str | None = None  # the pair that answered, once known
        self.output: list[dict] = []
        self.done = False
        self.seq = 0
        self._open_kind: str | None = None  # the item a stream is writing ("reasoning", "message"), and its text
        self._buffer: list[str] = []

    def body(self, status: str, extra: dict | None = None) -> dict:
        p = self.parsed
        fmt = p.text.format.model_dump(by_alias=True, exclude_none=True) if p.text and p.text.format else None
        tools = [{"type": "function", **t.model_dump(exclude={"type"})} for t in p.tools or ()]
        choice = p.tool_choice.model_dump() if hasattr(p.tool_choice, "model_dump") else (p.tool_choice or "auto")
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model or p.model,
            "output": self.output,
            "instructions": p.instructions,
            "tools": tools,
            "tool_choice": choice,
            "parallel_tool_calls": p.parallel_tool_calls,
            "text": {"format": fmt or {"type": "text"}},
            "reasoning": p.reasoning.model_dump() if p.reasoning else {"effort": None, "summary": None},
            "temperature": p.temperature,
            "top_p": p.top_p,
            "max_output_tokens": p.max_output_tokens,
            "previous_response_id": p.previous_response_id,
            "store": p.store,
            "truncation": p.truncation or "disabled",
            "metadata": {},
            "error": None,
            "incomplete_details": None,
            "usage": None,
            **(extra or {}),
        }

    def items(self, choice: Choice) -> list[dict]:
        """The output items of a finished choice: reasoning, the message, the function calls; the last one of an
        answer cut by max_output_tokens says `incomplete`, as the response does."""
        items = [_reasoning(choice.reasoning)] if choice.reasoning else []
        if choice.text:
            items.append(_message(choice.text))
        items += [_call(c) for c in choice.calls]
        if items and choice.finish == "length":
            items[-1]["status"] = "incomplete"
        return items

    async def finish(self, answer: Answer, choice: Choice) -> dict:
        """The final response object; stored unless `store: false`."""
        self.model = answer.model
        if not self.output:
            self.output = self.items(choice)
        u = answer.usage()
        usage = {
            "input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens or 0},
            "total_tokens": u.prompt_tokens + u.completion_tokens,
        }
        status = {"length": "incomplete", "cancelled": "cancelled"}.get(choice.finish, "completed")
        extra = {"usage": usage, **answer.stats()}
        if status == "incomplete":
            extra["incomplete_details"] = {"reason": "max_output_tokens"}
        body = self.body(status, extra)
        self.done = True
        await self._keep(body, Message("assistant", choice.text or "", choice.reasoning, tuple(choice.calls)))
        return body

    def cancelled(self) -> None:
        """The stream closed before it finished (its client went away): stored as `cancelled`."""
        if not self.done:
            self.done = True
            task = asyncio.get_running_loop().create_task(self._keep(self.body("cancelled"), None))
            _unsaved.add(task)  # held until it ends (the loop keeps only a weak reference)
            task.add_done_callback(_unsaved.discard)

    async def _keep(self, body: dict, answer: Message | None) -> None:
        """Store the response (unless `store: false`); a store that fails now costs the stored copy, not the answer."""
        if not self.parsed.store:
            return
        try:
            await self.store.put(body, messages_to_json([*self.turns, *([answer] if answer else [])]))
        except ApiError as e:
            log.warning("response %s was answered but not stored: %s", body["id"], e)

    def _event(self, kind: str, **data) -> bytes:
        self.seq += 1
        payload = {"type": kind, "sequence_number": self.seq, **data}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()

    async def events(self, answer: Answer, events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
        """The Responses event stream: created, in progress, each item's events, then completed (or incomplete,
        failed) — or `error` where the request failed."""
        yield self._event("response.created", response=self.body("in_progress"))
        yield self._event("response.in_progress", response=self.body("in_progress"))
        async for event in events:
            if isinstance(event, Delta):
                for chunk in self._pieces(event, tools=answer.tools is not None):
                    yield chunk
            elif isinstance(event, Choice):
                async for chunk in self._end(answer, event):
                    yield chunk
            else:
                assert isinstance(event, Failure)
                yield self._event("error", **event.error.body()["error"])

    def _pieces(self, delta: Delta, tools: bool) -> Iterator[bytes]:
        """A token's text: reasoning and message items (with tools the answer waits to be parsed at its end)."""
        for part, text, _ in delta.pieces:
            kind = "reasoning" if part == THINKING else "message"
            if kind == "message" and tools:
                continue
            if self._open_kind != kind:
                yield from self._close(self._open_kind, self._buffer)
                self._open_kind, self._buffer = kind, []
                yield from self._open(kind)
            self._buffer.append(text)
            yield self._delta(kind, text)

    async def _end(self, answer: Answer, choice: Choice) -> AsyncIterator[bytes]:
        """The answer's end: the open item closed, the message and calls where tools were offered, the final object."""
        wholes = [i for i in self.items(choice) if i["type"] != "reasoning"] if answer.tools is not None else []
        for chunk in self._close(self._open_kind, self._buffer, "completed" if wholes else _status(choice)):
            yield chunk
        self._open_kind = None
        for whole in wholes:  # the last one of a cut answer says `incomplete`
            for chunk in self._whole(whole):
                yield chunk
        body = await self.finish(answer, choice)
        kind = {"incomplete": "response.incomplete", "cancelled": "response.failed"}.get(body["status"])
        yield self._event(kind or "response.completed", response=body)

    def _open(self, kind: str) -> list[bytes]:
        item = _reasoning("") if kind == "reasoning" else _message("")
        item["status"] = "in_progress"
        item["content"] = []
        self.output.append(item)
        index = len(self.output) - 1
        out = [self._event("response.output_item.added", output_index=index, item=dict(item))]
        part = {"type": "reasoning_text" if kind == "reasoning" else "output_text", "text": ""}
        if kind == "message":
            part["annotations"] = []
        out.append(self._event("response.content_part.added", item_id=item["id"], output_index=index,
                               content_index=0, part=part))  # fmt: skip
        return out

    def _delta(self, kind: str, text: str) -> bytes:
        index = len(self.output) - 1
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        return self._event(name, item_id=self.output[index]["id"], output_index=index, content_index=0, delta=text,
                           **extra)  # fmt: skip

    def _close(self, kind: str | None, buffer: list[str], status: str = "completed") -> list[bytes]:
        """The open item's `.done` events (`status`: "incomplete" where the answer was cut in it)."""
        if kind is None:
            return []
        index, text = len(self.output) - 1, "".join(buffer)
        whole = _reasoning(text.strip()) if kind == "reasoning" else _message(text)
        whole["id"] = self.output[index]["id"]
        if status != "completed":
            whole["status"] = status
        self.output[index] = whole
        name = "response.reasoning_text.done" if kind == "reasoning" else "response.output_text.done"
        part = whole["content"][0]
        where = {"item_id": whole["id"], "output_index": index, "content_index": 0}
        return [
            self._event(name, **where, text=part["text"]),
            self._event("response.content_part.done", **where, part=part),
            self._event("response.output_item.done", output_index=index, item=whole),
        ]

    def _whole(self, item: dict) -> list[bytes]:
        """An item known whole at the end (the answer and calls of a request with tools), as its events."""
        if item["type"] == "message":
            yield from self._open("message")
            yield self._delta("message", item["content"][0]["text"])
            yield from self._close("message", [item["content"][0]["text"]], item["status"])
            return
        self.output.append({**item, "arguments": "", "status": "in_progress"})
        index = len(self.output) - 1
        yield self._event("response.output_item.added", output_index=index, item=self.output[index])
        where = {"item_id": item["id"], "output_index": index}
        yield self._event("response.function_call_arguments.delta", **where, delta=item["arguments"])
        yield self._event("response.function_call_arguments.done", **where, arguments=item["arguments"])
        self.output[index] = item
        yield self._event("response.output_item.done", output_index=index, item=item)


def _status(choice: Choice) -> str:
    """The status of the item a choice ends in: `incomplete` where max_output_tokens cut it."""
    return "incomplete" if choice.finish == "length" else "completed"


def _reasoning(text: str) -> dict:
    return {"type": "reasoning", "id": _id("rs_"), "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def _message(text: str) -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "message", "id": _id("msg_"), "status": "completed", "role": "assistant", "content": [part]}


def _call(call: dict) -> dict:
    f = call["function"]
    return {"type": "function_call", "id": _id("fc_"), "call_id": call["id"], "name": f["name"],
            "arguments": f["arguments"], "status": "completed"}  # fmt: skip
