"""How a route runs its translated request on the one engine path: queued on its pair's `Runner` (server/pairs.py:
loaded first if it is not), watched for a client that leaves (`watched`), awaited whole (`whole`) or followed event
by event (`streamed`: a `Stream`, whose `events` is the one reader of the engine's events, a failure mapped to an
`ApiError` there once). Both give the neutral
`Answer` (server/answer.py); every route — chat completions, completions, Messages, Responses — is a translation of
its wire shape onto `request.Request` and an encoder of that answer, never a second engine. When the server stops,
a request still waiting is answered 503 `server_stopping` at once and a stream ends on that error event: neither
waits for the engine thread to finish its step, so uvicorn's grace period never has to cut one short.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from starlette.requests import Request as HttpRequest

from localspec.errors import ContextError, LocalspecError, ModelFileError, NoRoomError

from . import request as request_mod
from .answer import Answer, Delta, Event, Failure
from .api import ApiError, model_error
from .images import request_pixels
from .pairs import STOP_POLL_S, Pairs
from .runner import stopping_error

log = logging.getLogger(__name__)


async def watched(awaitable, http: HttpRequest, job: request_mod.Job, router: Pairs, every: float = 0.25):
    """Await `awaitable` (the job's result, or its first event) while watching the client: one that leaves
    cancels the job — skipped if it still waits in the queue, stopped after the current step if it runs.

    Raises:
        ApiError: 503 `server_stopping` as soon as the server stops (the job is cancelled, not waited for).
    """
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            if router.stopping:  # before a result: the job may have ended cancelled because the server stops
                job.cancel()
                raise stopping_error()
            done, _ = await asyncio.wait({task}, timeout=min(every, STOP_POLL_S))
            if done and not router.stopping:
                return task.result()
            if not job.cancelled and await http.is_disconnected():
                log.info("%s %s: the client went away; its request is cancelled", http.method, http.url.path)
                job.cancel()
    except asyncio.CancelledError:  # the server is stopping
        job.cancel()
        raise
    finally:
        if task.done():
            task.cancelled() or task.exception()  # read: what the job raised as the server stopped is nobody's now
        else:
            task.cancel()


async def images_ready(http: HttpRequest, router: Pairs, name: str, request: request_mod.Request) -> None:
    """The request's images preprocessed on the server's images thread before its job (never on the engine thread),
    their positions counted before each is decoded: a request whose images cannot fit is refused before most are
    decoded, and a client that leaves (or the server stopping) ends it between two images.

    Raises:
        ApiError: 400 for images too many pixels or positions, or one libmtmd cannot decode; 499 when the client
            left; 503 when the server is stopping.
    """
    images = [image for m in request.messages or () for image in m.images]
    if not images:
        return
    request_pixels(images)
    served = router.runner(name).served
    media = served.engine.media if served is not None else None
    if served is None or media is None or not media.sees_images:
        return  # the job refuses them in its turn, naming the fix (request.py)
    stop = threading.Event()
    log.info("%s %s: reading %d images before its turn", http.method, http.url.path, len(images))
    waited = asyncio.wrap_future(router.images.submit(media.prepare, images, served.engine.n_ctx, stop.is_set))
    try:
        while not (await asyncio.wait({waited}, timeout=STOP_POLL_S))[0]:
            if router.stopping:  # answered at once; the reading stops at its next image
                stop.set()
                raise stopping_error()
            if not stop.is_set() and await http.is_disconnected():
                stop.set()
        ready = waited.result()
    except asyncio.CancelledError:  # the server is stopping
        stop.set()
        raise
    except ContextError as e:
        why = f"{e}, or restart the server with a larger --n-ctx"
        raise ApiError(400, why, param="messages", code="context_length_exceeded") from None
    except LocalspecError as e:  # a sound header over data libmtmd cannot decode
        raise ApiError(400, str(e), param="messages", code="invalid_image") from None
    if not ready and router.stopping:
        raise stopping_error()
    if not ready:
        log.info("%s %s: the client went away while its images were read", http.method, http.url.path)
        raise ApiError(499, "the request was cancelled", code="cancelled")


async def whole(http: HttpRequest, router: Pairs, model: str | None, request: request_mod.Request) -> Answer:
    """The request's answer, once every choice has ended."""
    name = await router.ready(model)
    await images_ready(http, router, name, request)
    job, future = router.submit(name, request)
    outcome: request_mod.Outcome = await watched(asyncio.wrap_future(future), http, job, router)
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
    stopping: Callable[[], bool]  # whether the server is stopping

    async def events(self) -> AsyncIterator[Event]:
        """The engine's events as the answer's: a `Delta` per token, a `Choice` as each ends (added to the answer),
        then a `Failure` if the request failed — or at once, the server stopping, the `server_stopping` one."""
        while True:
            item = await self._next()
            if item is None:
                log.info("a stream ended: the server is stopping")
                yield Failure(stopping_error())
                return
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
                    api = _as_api(error)
                    log.info("a stream ended on an error: %s", api)
                    yield Failure(api)
                return

    async def _next(self) -> request_mod.Event | None:
        """The next event, as soon as it is there (None: the server is stopping)."""
        while not self.stopping():
            if not self.queue.empty():
                return self.queue.get_nowait()
            try:
                async with asyncio.timeout(STOP_POLL_S):
                    return await self.queue.get()
            except TimeoutError:
                pass
        return None


def pool_full(error: NoRoomError) -> ApiError:
    """A prompt the pool the slots share had no room for, with no running request left to make room (one that
    finds the pool held by running requests waits for them: server/scheduler.py): 503."""
    why = f"the prompt finds no room in the slots' shared KV pool: {error}"
    return ApiError(503, why, "server_error", code="kv_full")


def _as_api(error: BaseException) -> ApiError:
    """What a stream's run raised as the error object: the server's (500) unless it is an `ApiError` already."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, NoRoomError):
        return pool_full(error)
    return model_error(error) if isinstance(error, ModelFileError) else ApiError(500, str(error), "server_error")


async def streamed(http: HttpRequest, router: Pairs, model: str | None, request: request_mod.Request) -> Stream:
    """The request running, once it has started (the prompt read, the pair known).

    Raises:
        ApiError: refused before generating (a prompt too long, a failed load), or cancelled while waiting.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[request_mod.Event] = asyncio.Queue()

    def emit(item: request_mod.Event) -> None:  # on the worker thread
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the event loop is gone (the server stopped): stop generating
            job.cancel()

    name = await router.ready(model)
    await images_ready(http, router, name, request)
    job, future = router.submit(name, request, emit)
    future.add_done_callback(lambda f: emit(request_mod.Done(f)))
    first = await watched(queue.get(), http, job, router)
    if isinstance(first, request_mod.Done):
        first.future.result()  # a plain error
        raise ApiError(499, "the request was cancelled", code="cancelled")
    assert isinstance(first, request_mod.Started)
    answer = Answer(first.model, first.prompt_tokens, first.tools, first.token_bytes)
    return Stream(answer, job, queue, lambda: router.stopping)
