"""The Starlette application over the router (server/pairs.py `Pairs`): its routes (health, models, and
server/routes.py's that answer), the security checks, the server-sent event response, and uvicorn.

`make_app(router, settings)` is used by `localspec serve` and by the tests alike. Every answer that is not a
success is OpenAI's error object with one line in the log and no traceback, and the server keeps serving. The
`Guard` middleware keeps a web page in the user's browser from driving the server: while it serves a loopback
address only loopback Host names are accepted (DNS rebinding), a POST body must be `application/json` (no simple
cross-site request), bodies are bounded, `--api-key` is compared in constant time, and CORS headers exist only
for the origins `--cors` names. A stop (SIGINT, SIGTERM, SIGHUP) answers every waiting client 503 `server_stopping`
in its protocol's shape (server/flow.py), and `serve` raises the signal again only once uvicorn's event loop is
closed, so the command ends on one line (cli/main.py) and never on a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import ipaddress
import json
import logging
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from localspec.errors import LocalspecError, ModelFileError, NoRoomError, RpcError

from . import messages_api
from .api import ApiError, model_error
from .flow import pool_full
from .pairs import STOP_POLL_S, Pairs
from .routes import answer_routes
from .runner import stopping_error
from .units import keep_alive_value

log = logging.getLogger(__name__)

MAX_BODY = 4 * 2**20  # bytes; a long chat is far below this
TIMEOUT_S = 30.0  # a request half sent is dropped after this (a slow client's connection is not held forever)
LOOPBACK_NAMES = ("localhost", "localhost.")


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """How the server faces the network (the `serve` flags)."""

    host: str = "127.0.0.1"
    api_key: str | None = None
    cors: tuple[str, ...] = ()  # origins allowed to read responses from a browser (empty: no CORS headers)
    max_body: int = MAX_BODY
    embedding_model: str | None = None  # `--embedding-model`: a GGUF for /v1/embeddings (None: the target)
    timeout: float = TIMEOUT_S  # `--timeout`: seconds a client has to send a request's head, and again its body
    allow_image_urls: bool = False  # `--allow-image-urls`: fetch an image's http(s) URL, read a local path's file


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, IPv6 possibly in brackets) is this machine's loopback."""
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The name of a Host header without its port ("[::1]:8080" -> "::1")."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def error_response(error: ApiError, scope: Scope) -> JSONResponse:
    """OpenAI's error object (Anthropic's on its Messages routes), and one line in the log."""
    log.info("%s %s -> %d %s: %s", scope.get("method"), scope.get("path"), error.status, error.code or "", error)
    body = messages_api.error_body(error) if messages_api.is_messages_path(scope.get("path", "")) else error.body()
    return JSONResponse(body, status_code=error.status, headers=error.headers)


class Guard:
    """ASGI middleware: the checks every request passes before any route, one log line per success, and the error
    object for a request uvicorn cancels as the server stops."""

    def __init__(self, app: ASGIApp, settings: ServerSettings, stopping: Callable[[], bool] = lambda: False) -> None:
        self.app, self.settings, self.stopping = app, settings, stopping
        self.loopback = is_loopback(settings.host)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        error = self._check(scope, Headers(scope=scope))
        if error is not None:
            await error_response(error, scope)(scope, receive, send)
            return

        started = False

        async def logged(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if message["status"] < 400 and scope["path"] != "/health":
                    log.info("%s %s -> %d", scope["method"], scope["path"], message["status"])
            await send(message)

        try:
            await self.app(scope, receive, logged)
        except asyncio.CancelledError:
            if not self.stopping():
                raise
            # Past uvicorn's grace period (a body still arriving, a stream its client does not read): answered as
            # the others were, or the response begun is ended; the task ends here instead of in uvicorn's traceback.
            if started:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            else:
                await error_response(stopping_error(), scope)(scope, receive, send)

    def _check(self, scope: Scope, headers: Headers) -> ApiError | None:
        host = headers.get("host")
        if self.loopback and host is not None and not is_loopback(_host_name(host)):
            return ApiError(403, f"Host '{host}' is not this machine's loopback name", code="forbidden_host")
        if scope["method"] == "OPTIONS":  # CORS preflight: answered (or refused) by the CORS layer
            return None
        key = self.settings.api_key
        if key is not None and scope["path"] != "/health":
            given = headers.get("authorization", "")
            scheme, _, token = given.partition(" ")
            # Starlette reads header bytes as Latin-1: encoding back gives the bytes the client sent (UTF-8 for a
            # non-ASCII key), compared with the key's UTF-8 bytes.
            sent = token.strip().encode("latin-1", errors="replace")
            if "x-api-key" in headers:  # Anthropic's clients send the key this way
                scheme, sent = "bearer", headers["x-api-key"].strip().encode("latin-1", errors="replace")
            if scheme.lower() != "bearer" or not hmac.compare_digest(sent, key.encode()):
                return ApiError(
                    401,
                    "a valid API key is required: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY')",
                    code="invalid_api_key",
                )
        if scope["method"] == "POST":
            kind = headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                return ApiError(
                    415, "the body must be sent as 'Content-Type: application/json'", code="unsupported_media_type"
                )
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > self.settings.max_body):
                return _too_large(self.settings.max_body)
        return None


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the body is larger than {limit} bytes", code="body_too_large")


class EventStream(StreamingResponse):
    """A server-sent event stream that calls `on_close` however it ends (finished, client gone, server stopping)."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except (OSError, ClientDisconnect):
            log.info("%s %s: the client went away; its generation stops", scope["method"], scope["path"])
        finally:
            self._on_close()


def make_app(router: Pairs, settings: ServerSettings = ServerSettings()) -> Starlette:
    """The application serving `router`'s pairs (loaded or not: /health says which)."""

    async def read_body(request: Request, limit: int) -> bytes:
        try:
            async with asyncio.timeout(settings.timeout):
                return await _unless_stopping(_read_body(request, limit), router)
        except TimeoutError:
            raise ApiError(
                408, f"the body was not sent within {settings.timeout:g} s", code="request_timeout"
            ) from None

    found = [*_pair_routes(router), *answer_routes(router, settings.max_body, read_body, EventStream, settings)]
    routes = [Route(path, _guarded(handler), methods=methods) for path, handler, methods in found]
    middleware = [Middleware(Guard, settings=settings, stopping=lambda: router.stopping)]
    if settings.cors:
        middleware.append(
            Middleware(
                _Cors,
                allow_origins=list(settings.cors),
                allow_methods=["GET", "POST", "DELETE"],
                allow_headers=["Authorization", "Content-Type", "x-api-key", "anthropic-version"],
            )
        )
    return Starlette(routes=routes, middleware=middleware, exception_handlers={HTTPException: _http_error})


def _pair_routes(router: Pairs) -> list[tuple[str, Callable[[Request], Awaitable[Response]], list[str]]]:
    """(path, handler, methods) of the routes about the pairs: /health, the models and one model (OpenAI's and
    Anthropic's shapes in one body), and the admin routes that load and unload a pair."""

    async def health(request: Request) -> Response:
        pairs = router.health()
        default = router.default_runner()
        loaded = any(p["loaded"] for p in pairs.values())
        status = "ok" if loaded or not pairs else "loading"
        body = {
            "status": status,
            "model": router.default,
            "queue": sum(p["queue"] for p in pairs.values()),
            "slots": {"busy": default.slots_busy, "total": default.parallel, "shared_ctx": default.n_ctx}
            if default
            else None,
            "pairs": pairs,
        }
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    async def models(request: Request) -> Response:
        data = [_model(name, router.facts(name)) for name in router.model_ids()]
        ends = {"first_id": data[0]["id"], "last_id": data[-1]["id"]} if data else {"first_id": None, "last_id": None}
        return JSONResponse({"object": "list", "data": data, "has_more": False, **ends})

    async def model(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in router.model_ids():
            raise ApiError(404, f"the model '{name}' does not exist here", param="model", code="model_not_found")
        return JSONResponse(_model(name, router.facts(name)))

    async def load(request: Request) -> Response:
        model, body = await _named(request)
        name = router.name_of(model)
        keep = body.get("keep_alive")
        router.runner(name).keep_alive = None if keep is None else _keep_alive(keep)
        await router.ready(name)
        return JSONResponse({"model": name, **router.facts(name)})

    async def unload(request: Request) -> Response:
        name = router.name_of((await _named(request))[0])
        log.info("unloading %s once its requests end (POST /models/unload)", name)
        await router.until(asyncio.wrap_future(router.unload(name)))
        return JSONResponse({"model": name, **router.facts(name)})

    return [
        ("/health", health, ["GET"]),
        ("/v1/models", models, ["GET"]),
        ("/v1/models/{name:path}", model, ["GET"]),
        ("/models/load", load, ["POST"]),
        ("/models/unload", unload, ["POST"]),
    ]


def _model(name: str, facts: dict) -> dict:
    """One pair as both OpenAI's model object and Anthropic's (`type`, `display_name`, `created_at`), with ours."""
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "localspec",
        "type": "model",
        "display_name": name,
        "created_at": "1970-01-01T00:00:00Z",
        **facts,
    }


def _keep_alive(value) -> float:
    try:
        return keep_alive_value(value)
    except ValueError as e:
        raise ApiError(400, str(e), param="keep_alive", code="invalid_value") from None


async def _named(request: Request) -> tuple[str, dict]:
    """The `model` of an admin route's body ({"model": NAME}, and for a load an optional "keep_alive"), and the body."""
    try:
        body = json.loads(await _read_body(request, 4096))
    except ValueError:
        raise ApiError(400, 'the body must be JSON: {"model": NAME}', code="invalid_json") from None
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        raise ApiError(400, 'name the pair: {"model": NAME}', param="model", code="missing_model")
    return body["model"], body


def _guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """`handler` whose every failure is an error object and one log line, never a traceback."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as e:
            return error_response(e, request.scope)
        except RpcError as e:  # a lost or busy RPC worker: the server's trouble, not the request's
            return error_response(ApiError(503, str(e), "server_error", code="rpc_error"), request.scope)
        except ModelFileError as e:  # the pair's weights compute NaN: the server's trouble, not the request's
            return error_response(model_error(e), request.scope)
        except NoRoomError as e:  # the slots' shared pool full with nothing running to free it
            return error_response(pool_full(e), request.scope)
        except LocalspecError as e:
            return error_response(ApiError(400, str(e)), request.scope)
        except ClientDisconnect:
            return Response(status_code=499)
        except Exception as e:  # a bug: one line for the client and the log, the server goes on
            log.debug("internal error", exc_info=True)
            return error_response(
                ApiError(500, f"internal error: {type(e).__name__}: {e}", "server_error"), request.scope
            )

    return endpoint


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = "not_found" if exc.status_code == 404 else "method_not_allowed" if exc.status_code == 405 else None
    return error_response(ApiError(exc.status_code, str(exc.detail), code=code), request.scope)


class _Cors(CORSMiddleware):
    """Starlette's CORS layer, whose refused preflight is OpenAI's error object like every other refusal."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        why = bytes(response.body).decode(errors="replace")  # "Disallowed CORS origin, method, headers"
        error = ApiError(
            response.status_code,
            f"the browser's preflight was refused ({why}): name its origin with --cors",
            code="cors_refused",
        )
        log.info("OPTIONS preflight -> %d cors_refused: %s", error.status, why)
        kept = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")}
        return JSONResponse(error.body(), status_code=error.status, headers=kept)


async def _unless_stopping(awaitable: Awaitable[bytes], router: Pairs) -> bytes:
    """`awaitable`'s result (a body arriving); 503 `server_stopping` as soon as the server stops instead.

    Raises:
        ApiError: the server is stopping.
    """
    task = asyncio.ensure_future(awaitable)
    try:
        while not (await asyncio.wait({task}, timeout=STOP_POLL_S))[0]:
            if router.stopping:
                raise stopping_error()
        return task.result()
    finally:
        if not task.done():
            task.cancel()


async def _read_body(request: Request, limit: int) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


class _Http(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for each request's head: a connection that sends its request line
    and headers too slowly, or nothing at all, is closed after `head_timeout` s instead of being held forever."""

    def __init__(self, *args, head_timeout: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout = head_timeout
        self._deadline: asyncio.TimerHandle | None = None
        self._after = None  # the request-response cycle the deadline waits for a successor of (None: the first)

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._after = self.cycle
        self._deadline = self.loop.call_later(self.head_timeout, self._overdue)

    def _overdue(self) -> None:
        if self.cycle is self._after and not self.transport.is_closing():  # no new request's head came in time
            log.info("a client sent no complete request within %g s: its connection is closed", self.head_timeout)
            self.transport.close()


class _Server(uvicorn.Server):
    """uvicorn's server, which also cancels the running generations when told to stop (the waiting clients answered
    at once, open streams ended), and leaves the signals that stopped it for `serve` to raise again."""

    def __init__(self, config: uvicorn.Config, router: Pairs) -> None:
        super().__init__(config)
        self.router = router
        self.signals: list[int] = []  # what stopped it, in order

    def handle_exit(self, sig, frame) -> None:
        self.router.cancel_all()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        # uvicorn raises the signals it caught again as this block ends, still inside asyncio.run: the CLI's
        # handler (cli/interrupts.py) raised there, through the loop's teardown, while the requests it cancelled
        # were still ending (the traceback of issue 67). `serve` raises them once the loop is closed.
        with super().capture_signals():
            try:
                yield
            finally:
                self.signals = list(getattr(self, "_captured_signals", ()))
                self._captured_signals = []


def serve(router: Pairs, settings: ServerSettings, port: int) -> bool:
    """Serve `router` on settings.host:port until SIGINT / SIGTERM (or SIGHUP, taken as SIGTERM); False when it could
    not listen."""
    config = uvicorn.Config(
        make_app(router, settings),
        host=settings.host,
        port=port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
        lifespan="off",
        http=functools.partial(_Http, head_timeout=settings.timeout),
    )
    server = _Server(config, router)

    def hung_up(_signum: int, frame) -> None:  # the terminal closed: stop as SIGTERM does (streams end cancelled)
        log.info("hung up: stopping as on SIGTERM")
        server.handle_exit(signal.SIGTERM, frame)

    previous = signal.signal(signal.SIGHUP, hung_up) if threading.current_thread() is threading.main_thread() else None
    try:
        server.run()
        for sig in reversed(server.signals):  # as uvicorn would, with its loop closed: `localspec serve` exits 130/143
            signal.raise_signal(sig)
    except SystemExit:  # uvicorn exits when it cannot bind (after logging one line)
        return False
    finally:
        if previous is not None:
            signal.signal(signal.SIGHUP, previous)
    return server.started
