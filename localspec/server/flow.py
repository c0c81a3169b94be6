"""How a route runs its translated request on the one engine path: queued on the `Runner`, watched for a client
that leaves (`watched`), awaited whole (`whole`) or followed event by event (`streamed`). Every route — chat
completions, completions, Messages, Responses — goes through these two, so each is a translation of its own wire
shape onto `request.Request`, never a second engine.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.requests import Request as HttpRequest

from . import request as request_mod
from .api import ApiError
from .runner import Runner

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


async def whole(http: HttpRequest, runner: Runner, model: str | None, request: request_mod.Request):
    """The request's `Outcome`, once every choice has ended."""
    job, future = runner.submit(model, request)
    return await watched(asyncio.wrap_future(future), http, job)


async def streamed(
    http: HttpRequest, runner: Runner, model: str | None, request: request_mod.Request
) -> tuple[request_mod.Started, asyncio.Queue, request_mod.Job]:
    """The request running: its `Started` event, the queue of the events that follow (`Token`, `Ended`, then
    `Done`), and its job (to cancel when the stream closes).

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

    job, future = runner.submit(model, request, emit)
    future.add_done_callback(lambda f: emit(request_mod.Done(f)))
    first = await watched(queue.get(), http, job)
    if isinstance(first, request_mod.Done):
        first.future.result()  # a plain error
        raise ApiError(499, "the request was cancelled", code="cancelled")
    assert isinstance(first, request_mod.Started)
    return first, queue, job
