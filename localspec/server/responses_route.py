"""`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`: OpenAI's Responses API over the one engine path.

The body is translated (server/responses_api.py) into the chat route's `request.Request` — after the stored
conversation of `previous_response_id` — and run by `flow`. The answer is written back as a response object whose
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
from collections.abc import AsyncIterator

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from localspec.core.session import Message
from localspec.core.thinking import THINKING

from . import flow
from . import request as request_mod
from .api import ApiError, parse_body
from .render import Reply, usage_and_timings
from .responses_api import IGNORED, UNSUPPORTED, ResponsesRequest, messages_from_json, messages_to_json
from .runner import Runner
from .store import ResponseStore

log = logging.getLogger(__name__)


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def routes(runner: Runner, max_body: int, read_body, event_stream) -> list[tuple[str, object, list[str]]]:
    store = ResponseStore(runner.paths.data_dir / "responses.sqlite3")

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
        request = parsed.to_request(history)
        turns = request.messages[1:] if parsed.instructions else request.messages
        answer = _Answer(parsed, store, list(turns or ()))
        if parsed.store:  # a store that cannot be used is said before the answer is generated, not after
            await store.check()
        if not parsed.stream:
            outcome = await flow.whole(http, runner, parsed.model, request)
            token_bytes = outcome.served.engine.target_model.token_bytes
            answer.reply = Reply("chat", outcome.served.name, tools=outcome.tools, token_bytes=token_bytes)
            [gen], [split] = outcome.generations or [None], outcome.splits or [None]
            if gen is None:
                raise ApiError(499, "the request was cancelled", code="cancelled")
            return JSONResponse(await answer.finish(outcome.prompt_tokens, gen, split))
        first, queue, job = await flow.streamed(http, runner, parsed.model, request)
        answer.reply = Reply("chat", first.model, tools=first.tools, token_bytes=first.token_bytes)

        def closed() -> None:
            job.cancel()
            answer.cancelled()

        return event_stream(answer.events(queue, first.prompt_tokens), closed)

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


class _Answer:
    """One response: its object (whole or built up event by event), its store."""

    def __init__(self, parsed: ResponsesRequest, store: ResponseStore, turns: list[Message]) -> None:
        self.parsed, self.store, self.turns = parsed, store, turns
        self.id, self.created = _id("resp_"), int(time.time())
        self.reply: Reply | None = None
        self.output: list[dict] = []
        self.done = False
        self.seq = 0

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
            "model": self.reply.model if self.reply else p.model,
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
            "truncation": "disabled",
            "metadata": {},
            "error": None,
            "incomplete_details": None,
            "usage": None,
            **(extra or {}),
        }

    def items(self, gen, split) -> list[dict]:
        """The output items of a finished generation: reasoning, the message, the function calls."""
        items = []
        if split is not None and split.reasoning:
            items.append(_reasoning(split.reasoning))
        text, calls = self.reply.calls(0, gen, split)
        if text:
            items.append(_message(text))
        items += [_call(c) for c in calls]
        return items

    async def finish(self, prompt_tokens: int, gen, split) -> dict:
        """The final response object; stored unless `store: false`."""
        if not self.output:
            self.output = self.items(gen, split)
        both = usage_and_timings(prompt_tokens, [gen], [split])
        u = both["usage"]
        usage = {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": u["prompt_tokens_details"]["cached_tokens"]},
            "output_tokens": u["completion_tokens"],
            "output_tokens_details": {
                "reasoning_tokens": u.get("completion_tokens_details", {}).get("reasoning_tokens", 0)
            },
            "total_tokens": u["total_tokens"],
        }
        status = {"length": "incomplete", "cancelled": "cancelled"}.get(gen.finish_reason, "completed")
        extra = {"usage": usage, "timings": both["timings"], "localspec": both["localspec"]}
        if status == "incomplete":
            extra["incomplete_details"] = {"reason": "max_output_tokens"}
        body = self.body(status, extra)
        self.done = True
        text, calls = self.reply.calls(0, gen, split)
        reasoning = split.reasoning if split is not None else ""
        await self._keep(body, Message("assistant", text or "", reasoning, tuple(calls)))
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

    async def events(self, queue: asyncio.Queue, prompt_tokens: int) -> AsyncIterator[bytes]:
        yield self._event("response.created", response=self.body("in_progress"))
        yield self._event("response.in_progress", response=self.body("in_progress"))
        open_kind: str | None = None
        buffer: list[str] = []
        while True:
            item = await queue.get()
            if isinstance(item, request_mod.Token):
                for part, text, _ in item.pieces:
                    kind = "reasoning" if part == THINKING else "message"
                    if kind == "message" and self.reply.tools is not None:
                        continue  # with tools the answer is parsed when it ends
                    if open_kind != kind:
                        for chunk in self._close(open_kind, buffer):
                            yield chunk
                        open_kind, buffer = kind, []
                        for chunk in self._open(kind):
                            yield chunk
                    buffer.append(text)
                    yield self._delta(kind, text)
            elif isinstance(item, request_mod.Ended):
                for chunk in self._close(open_kind, buffer):
                    yield chunk
                open_kind = None
                if self.reply.tools is not None:
                    for whole in self.items(item.generation, item.split):
                        if whole["type"] != "reasoning":
                            for chunk in self._whole(whole):
                                yield chunk
                body = await self.finish(prompt_tokens, item.generation, item.split)
                kind = {"incomplete": "response.incomplete", "cancelled": "response.failed"}.get(body["status"])
                yield self._event(kind or "response.completed", response=body)
            elif isinstance(item, request_mod.Done):
                error = item.future.exception()
                if error is not None:
                    api = error if isinstance(error, ApiError) else ApiError(500, str(error), "server_error")
                    yield self._event("error", **api.body()["error"])
                return

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

    def _close(self, kind: str | None, buffer: list[str]) -> list[bytes]:
        if kind is None:
            return []
        index, text = len(self.output) - 1, "".join(buffer)
        whole = _reasoning(text.strip()) if kind == "reasoning" else _message(text)
        whole["id"] = self.output[index]["id"]
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
            yield from self._close("message", [item["content"][0]["text"]])
            return
        self.output.append({**item, "arguments": "", "status": "in_progress"})
        index = len(self.output) - 1
        yield self._event("response.output_item.added", output_index=index, item=self.output[index])
        where = {"item_id": item["id"], "output_index": index}
        yield self._event("response.function_call_arguments.delta", **where, delta=item["arguments"])
        yield self._event("response.function_call_arguments.done", **where, arguments=item["arguments"])
        self.output[index] = item
        yield self._event("response.output_item.done", output_index=index, item=item)


def _reasoning(text: str) -> dict:
    return {"type": "reasoning", "id": _id("rs_"), "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def _message(text: str) -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "message", "id": _id("msg_"), "status": "completed", "role": "assistant", "content": [part]}


def _call(call: dict) -> dict:
    f = call["function"]
    return {"type": "function_call", "id": _id("fc_"), "call_id": call["id"], "name": f["name"],
            "arguments": f["arguments"], "status": "completed"}  # fmt: skip
