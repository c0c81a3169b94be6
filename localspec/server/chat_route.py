"""`POST /v1/chat/completions` and `/v1/completions`: OpenAI's two text routes over the one engine path.

The body is read by server/chat_api.py (api.py's wire shapes) and translated by its `to_request()`; `flow` runs it
and gives the neutral `Answer`, which server/render.py writes as OpenAI's response object or its chunks.
"""

from __future__ import annotations

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from . import flow
from .api import parse_body
from .chat_api import ChatBody, CompletionBody
from .images import ImageReader, translated
from .pairs import Pairs
from .render import chat_body, chat_stream


def routes(
    router: Pairs, max_body: int, read_body, event_stream, images: ImageReader
) -> list[tuple[str, object, list[str]]]:
    """(path, handler, methods) of the two routes; `read_body` and `event_stream` are the app's, `images` reads a
    message's images."""

    async def answer(http: HttpRequest, parsed: ChatBody | CompletionBody, kind: str) -> Response:
        request = await translated(images, parsed.to_request)
        if not parsed.stream:
            return JSONResponse(chat_body(await flow.whole(http, router, parsed.model, request), kind))
        stream = await flow.streamed(http, router, parsed.model, request)
        include_usage = bool(parsed.stream_options and parsed.stream_options.include_usage)
        chunks = chat_stream(stream.answer, stream.events(), kind, parsed.n, include_usage)
        return event_stream(chunks, stream.job.cancel)

    async def chat(http: HttpRequest) -> Response:
        return await answer(http, parse_body(await read_body(http, max_body), ChatBody), "chat")

    async def completions(http: HttpRequest) -> Response:
        return await answer(http, parse_body(await read_body(http, max_body), CompletionBody), "text")

    return [("/v1/chat/completions", chat, ["POST"]), ("/v1/completions", completions, ["POST"])]
