"""MCP servers for the chat: where they are configured (`mcp.toml` in the config folder, `--mcp`) and the client.

The official `mcp` SDK is asyncio (anyio), and a server's session must be entered and left in one task; so `McpHub`
runs one event loop on a thread of its own, with one long-lived task per server, and the app's workers call `call`
from their threads and wait on a future (that they can give up on). A server's stderr goes to a log file, never
over the chat's screen. Nothing here touches Textual; every failure is one line, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import threading
import tomllib
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localspec.errors import ConfigError

log = logging.getLogger(__name__)

MCP_FILE = "mcp.toml"  # in the config folder
START_TIMEOUT = 20.0  # seconds a server may take to start and list its tools
CALL_TIMEOUT = 60.0  # seconds a tool call may take (a server's `timeout` overrides it)
MAX_RESULT_CHARS = 8000  # a longer result is cut, with a note: the model reads it in its context
TOOL_CHOICES = ("auto", "required")


@dataclass(frozen=True, slots=True)
class McpServer:
    """One MCP server: a command run over stdio, or the URL of a streamable HTTP one."""

    name: str
    command: tuple[str, ...] = ()
    url: str = ""
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = CALL_TIMEOUT

    def describe(self) -> str:
        return self.url or shlex.join(self.command)


@dataclass(frozen=True, slots=True)
class McpConfig:
    """The chat's MCP servers and how their tools are offered."""

    servers: tuple[McpServer, ...] = ()
    tool_choice: str = "auto"  # "required": the first answer to each message calls a tool (grammar-constrained)
    max_rounds: int = 4  # rounds of calls in one answer; the answer after the last one is offered no call
    max_result_chars: int = MAX_RESULT_CHARS
    start_timeout: float = START_TIMEOUT


def server_from_flag(text: str, index: int) -> McpServer:
    """`--mcp COMMAND` (a command line, run over stdio) or `--mcp URL` (streamable HTTP)."""
    text = text.strip()
    if text.startswith(("http://", "https://")):
        return McpServer(f"mcp{index}", url=text)
    try:
        command = tuple(shlex.split(text))
    except ValueError as e:
        raise ConfigError(f"--mcp {text!r}: {e}: quote it as a shell would") from None
    if not command:
        raise ConfigError("--mcp needs a command line (run over stdio) or an http(s):// URL")
    return McpServer(Path(command[0]).name or f"mcp{index}", command=command)


def load_mcp_config(path: Path, flags: tuple[str, ...] = ()) -> McpConfig:
    """The servers of `path` (`mcp.toml`; absent: none) and those of the `--mcp` flags.

    Raises:
        ConfigError: the file is not TOML, or a server or a setting in it is not what it should be.
    """
    data: dict[str, Any] = {}
    if path.is_file():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"{path}: {e}: fix it or move it away") from None
    servers = [_server(path, name, table) for name, table in (data.get("servers") or {}).items()]
    servers += [server_from_flag(text, i + 1) for i, text in enumerate(flags)]
    names = [s.name for s in servers]  # two servers of one name: the later ones get a number
    servers = [s if names[: i + 1].count(s.name) == 1 else _renamed(s, i) for i, s in enumerate(servers)]
    choice = data.get("tool_choice", "auto")
    if choice not in TOOL_CHOICES:
        raise ConfigError(f"{path}: tool_choice is {choice!r}: use one of {', '.join(TOOL_CHOICES)}")
    numbers = {k: data.get(k, d) for k, d in (("max_rounds", 4), ("max_result_chars", MAX_RESULT_CHARS))}
    numbers["start_timeout"] = data.get("start_timeout", START_TIMEOUT)
    for key, value in numbers.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 1:
            raise ConfigError(f"{path}: {key} is {value!r}: give a number of 1 or more")
    return McpConfig(
        tuple(servers),
        choice,
        int(numbers["max_rounds"]),
        int(numbers["max_result_chars"]),
        float(numbers["start_timeout"]),
    )


def _renamed(server: McpServer, index: int) -> McpServer:
    return McpServer(f"{server.name}{index + 1}", server.command, server.url, server.env, server.timeout)


def _server(path: Path, name: str, table: Any) -> McpServer:
    where = f"{path}: [servers.{name}]"
    if not isinstance(table, dict):
        raise ConfigError(f'{where} is not a table: give it `command = [...]` or `url = "..."`')
    command, url = table.get("command"), table.get("url", "")
    if isinstance(command, str):
        command = [command, *table.get("args", [])]
    if (command is None) == (not url):
        raise ConfigError(f"{where}: give either `command` (run over stdio) or `url` (streamable HTTP)")
    if command is not None and not (command and all(isinstance(c, str) for c in command)):
        raise ConfigError(f"{where}: `command` is a list of strings, the program first")
    env, timeout = table.get("env", {}), table.get("timeout", CALL_TIMEOUT)
    if not isinstance(env, dict) or isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ConfigError(f"{where}: `env` is a table of strings and `timeout` a number of seconds")
    return McpServer(name, tuple(command or ()), str(url), {str(k): str(v) for k, v in env.items()}, float(timeout))


@dataclass(frozen=True, slots=True)
class McpTool:
    """A tool of a started server, under the name the model sees (the server's, or `server_tool` when two servers
    have a tool of one name)."""

    server: str
    name: str
    tool: str
    description: str
    parameters: dict


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What a call came back with: "ok", "error" (the tool's or the server's) or "timeout", and the text."""

    status: str
    text: str


@dataclass(slots=True)
class _Run:
    """One server's life: the future its task sets once the session is up, the event that asks it to end, the
    cancel scope that ends it when it does not listen (anyio's: the SDK's shielded shutdown, which ends the
    process, holds against it, not against a bare `Task.cancel`), and the task."""

    ready: asyncio.Future
    stop: asyncio.Event
    scope: Any  # anyio.CancelScope (anyio comes with the SDK, imported when a server starts)
    task: asyncio.Task | None = None


class McpHub:
    """The chat's MCP servers, running on their own event loop thread.

    Args:
        config: the servers and limits.
        errlog: where the servers' stderr goes (a file; default the null device).
    """

    def __init__(self, config: McpConfig, errlog: Path | None = None) -> None:
        self.config = config
        self.tools: list[McpTool] = []
        self._errlog_path = errlog
        self._sessions: dict[str, Any] = {}
        self._runs: list[_Run] = []
        self._closing = False  # set by `close`: a server not started yet is not started at all
        self._starting: asyncio.Task | None = None  # `start`'s, which `close` lets end (its caller waits on it)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="localspec-mcp", daemon=True)
        self._thread.start()

    def start(self) -> list[str]:
        """Start every server and list its tools (blocking; call it from a worker thread); one line per server
        that did not start or list its tools in `start_timeout` (the others' tools are kept)."""
        future = asyncio.run_coroutine_threadsafe(self._start_all(), self._loop)
        return future.result()

    async def _start_all(self) -> list[str]:
        self._starting = asyncio.current_task()
        self._errlog = _open_errlog(self._errlog_path)
        results = await asyncio.gather(*(self._open(s) for s in self.config.servers))
        errors: list[str] = []
        seen: set[str] = set()
        for server, (error, tools) in zip(self.config.servers, results, strict=True):
            if error:
                errors.append(error)
            for tool in tools:
                name = tool.name if tool.name not in seen else f"{server.name}_{tool.name}"
                seen.add(name)
                parameters = dict(tool.input_schema or {})
                parameters.pop("title", None)
                self.tools.append(McpTool(server.name, name, tool.name, tool.description or "", parameters))
        return errors

    async def _open(self, server: McpServer) -> tuple[str | None, list]:
        """Start one server and list its tools, both within `start_timeout`: (None, its tools), or (the line that
        says why not, []) with its process ended — a server that never answers must not hold the others' tools."""
        if self._closing:
            return None, []
        import anyio

        run = _Run(asyncio.get_running_loop().create_future(), asyncio.Event(), anyio.CancelScope())
        run.task = asyncio.create_task(self._run(server, run))
        self._runs.append(run)
        what, timeout = "start", self.config.start_timeout
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(run.ready)
                what = "list its tools"
                listed = await self._sessions[server.name].list_tools()
            return None, list(listed.tools)
        except TimeoutError:
            error = f"MCP server {server.name} ({server.describe()}) did not {what} in {timeout:g} s"
        except Exception as e:
            error = f"MCP server {server.name} ({server.describe()}) did not {what}: {_reason(e)}"
        await _end(run)
        return (f"{error}: its tools are left out" if what != "start" else error), []

    async def _run(self, server: McpServer, run: _Run) -> None:
        """One server's whole life in one task (the SDK's contexts are entered and left here)."""
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client
        from mcp.client.streamable_http import streamable_http_client

        try:
            if server.url:
                transport = streamable_http_client(server.url)
            else:
                params = StdioServerParameters(command=server.command[0], args=list(server.command[1:]), env=server.env)
                transport = stdio_client(params, errlog=self._errlog)
            with run.scope:
                async with transport as streams, ClientSession(streams[0], streams[1]) as session:
                    await session.initialize()
                    self._sessions[server.name] = session
                    run.ready.set_result(True)
                    await run.stop.wait()
        except BaseException as e:  # noqa: BLE001 (a task group's ExceptionGroup too): the server is gone
            if not run.ready.done():
                run.ready.set_exception(e if isinstance(e, Exception) else RuntimeError(str(e)))
            else:
                log.warning("MCP server %s ended: %s", server.name, _reason(e))
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            self._sessions.pop(server.name, None)
            if not run.ready.done():  # ended by its scope before it started
                run.ready.set_exception(ConnectionError("stopped before it started"))

    def call(self, tool: McpTool, arguments: dict, stopped: Callable[[], bool] = lambda: False) -> ToolOutcome:
        """Run `tool` with `arguments` (blocking, from a worker); its outcome, the text cut to `max_result_chars`.

        `stopped` is asked twice a second: when it says so, the call is given up ("error", stopped by the user).
        """
        server = next(s for s in self.config.servers if s.name == tool.server)
        session = self._sessions.get(tool.server)
        if session is None:
            return ToolOutcome("error", f"MCP server {tool.server} is not running (see the log)")
        future: Future = asyncio.run_coroutine_threadsafe(
            session.call_tool(tool.tool, arguments, read_timeout_seconds=server.timeout), self._loop
        )
        waited = 0.0
        while True:
            try:
                result = future.result(timeout=0.5)
                break
            except FutureTimeout:
                waited += 0.5
                if stopped() or waited > server.timeout + 5:
                    future.cancel()
                    if stopped():
                        return ToolOutcome("error", "stopped by the user before the tool answered")
                    return ToolOutcome("timeout", f"{tool.name} did not answer in {server.timeout:g} s")
            except Exception as e:
                if "timed out" in str(e):
                    return ToolOutcome("timeout", f"{tool.name} did not answer in {server.timeout:g} s")
                return ToolOutcome("error", f"{tool.name} failed: {_reason(e)}")
        text = "\n".join(_content_text(block) for block in getattr(result, "content", None) or [])
        return ToolOutcome("error" if getattr(result, "is_error", False) else "ok", self._cut(text))

    def _cut(self, text: str) -> str:
        limit = self.config.max_result_chars
        if len(text) <= limit:
            return text
        return f"{text[:limit]}\n[… cut: the tool returned {len(text):,} characters; the first {limit:,} are kept]"

    def close(self) -> None:
        """Stop every server — one still starting too — so their processes end, then the loop thread."""

        async def stop_all() -> None:
            self._closing = True
            await asyncio.gather(*(_end(run) for run in self._runs))
            if self._starting is not None:  # its servers ended: it returns their lines, and `start` returns
                await asyncio.wait({self._starting}, timeout=5)
            with contextlib.suppress(AttributeError, OSError):
                self._errlog.close()

        if self._loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(stop_all(), self._loop).result(timeout=15)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)


async def _end(run: _Run) -> None:
    """End one server's task and wait for it: the SDK's contexts close on the way out, and the stdio client ends
    the process there (closes its stdin, then terminates it). A server that started is asked to end; one still in
    `initialize` (it never reaches the wait on `stop`), or one that does not end when asked, is cancelled."""
    assert run.task is not None
    run.stop.set()
    started = run.ready.done() and not run.ready.cancelled() and run.ready.exception() is None
    if not started or not (await asyncio.wait({run.task}, timeout=5))[0]:
        run.scope.cancel()
        if not (await asyncio.wait({run.task}, timeout=8))[0]:  # the SDK's own waits: 2 s, then the kill's
            run.task.cancel()
    if run.ready.done() and not run.ready.cancelled():
        run.ready.exception()  # retrieved: no "exception never retrieved" in the log for a server already named


def _open_errlog(path: Path | None):
    """Where the servers' stderr goes: the log file, else (no folder for it) the null device."""
    try:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        return open(path or os.devnull, "a", encoding="utf-8")  # noqa: SIM115 (closed by `close`)
    except OSError:
        return open(os.devnull, "a", encoding="utf-8")  # noqa: SIM115


def _content_text(block: Any) -> str:
    """One content block of a result as text (an image or a resource by what it is)."""
    if getattr(block, "type", "") == "text":
        return block.text
    return f"[{getattr(block, 'type', 'content')}: {getattr(block, 'mime_type', '') or 'not shown'}]"


def _reason(error: BaseException) -> str:
    """The innermost message of an error (a task group wraps the real one)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return text or type(error).__name__
