"""How a route runs its translated request on the one engine path: queued on its pair's `Runner` (server/pairs.py:
loaded first if it is not), watched for a client that leaves (`watched`), awaited whole (`whole`) or followed event
by event (`streamed`: a `Stream`, whose `events` is the one reader of the engine's events, a failure mapped to an
`ApiError` there once). Both give the neutral
`Answer` (server/answer.py); every route — chat completions, completions, Messages, Responses — is a translation of
its wire shape onto `request.Request` and an encoder of that answer, never a second engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request as HttpRequest

from . import request as request_mod
from .answer import Answer, Delta, Event, Failure
from .api import ApiError
from .pairs import Pairs

log = logging.getLogger(__name__)


async def watched(awaitable, http: HttpRequest, job: request_mod.Job, every: float = 0.25):
    """Await `awaitable` (the job's result, or its first event) while watching the client: one that leaves
    cancels the job — skipped if it still waits in the queue, stopped after the current step if it runs."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every)
            if done:
                return task.result()
            if not job.cancelled and await http.is_disconnected():
                log.info("%s %s: the client went away; its request is cancelled", http.method, http.url.path)
                job.cancel()
    except asyncio.CancelledError:  # the server is stopping
        job.cancel()
        raise
    finally:
        if not task.done():
            task.cancel()


async def whole(http: HttpRequest, runner: Pairs, model: str | None, request: request_mod.Request) -> Answer:
    """The request's answer, once every choice has ended."""
    job, future = runner.submit(await runner.ready(model), request)
    outcome: request_mod.Outcome = await watched(asyncio.wrap_future(future), http, job)
    served = outcome.served
    answer = Answer(served.name, outcome.prompt_tokens, outcome.tools, served.engine.target_model.token_bytes)
    for gen, split in zip(outcome.generations, outcome.splits or [None] * len(outcome.generations)):
        answer.add(gen, split)
    return answer


@dataclass(slots=True)
class Stream:
    """A streamed request, running: its answer (choices added as they end) and its job (cancelled when the stream
    closes, however it closes)."""

    answer: Answer
    job: request_mod.Job
    queue: asyncio.Queue[request_mod.Event]

    async def events(self) -> AsyncIterator[Event]:
        """The engine's events as the answer's: a `Delta` per token, a `Choice` as each ends (added to the answer),
        then a `Failure` if the request failed."""
        while True:
            item = await self.queue.get()
            if isinstance(item, request_mod.Token):
                token, logprob = item.event.token, item.logprob
                yield Delta(
                    item.index, item.pieces, (token, logprob) if token is not None and logprob is not None else None
                )
            elif isinstance(item, request_mod.Ended):
                yield self.answer.add(item.generation, item.split)
            elif isinstance(item, request_mod.Done):
                error = item.future.exception()
                if error is not None:
                    api = error if isinstance(error, ApiError) else ApiError(500, str(error), "server_error")
                    log.info("a stream ended on an error: %s", api)
                    yield Failure(api)
                return


async def streamed(http: HttpRequest, runner: Pairs, model: str | None, request: request_mod.Request) -> Stream:
    """The request running, once it has started (the prompt read, the pair known).

    Raises:
        ApiError: refused before generating (a prompt too long, a failed switch), or cancelled while waiting.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[request_mod.Event] = asyncio.Queue()

    def emit(item: request_mod.Event) -> None:  # on the worker thread
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the event loop is gone (the server stopped): stop generating
            job.cancel()

    job, future = runner.submit(await runner.ready(model), request, emit)
    future.add_done_callback(lambda f: emit(request_mod.Done(f)))
    first = await watched(queue.get(), http, job)
    if isinstance(first, request_mod.Done):
        first.future.result()  # a plain error
        raise ApiError(499, "the request was cancelled", code="cancelled")
    assert isinstance(first, request_mod.Started)
    return Stream(Answer(first.model, first.prompt_tokens, first.tools, first.token_bytes), job, queue)
