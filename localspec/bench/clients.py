"""`localspec bench --clients`: several clients at once against `localspec serve --parallel N` and llama-server `-np N`.

Each server runs in a process of its own: localspec's server on the bench's pair and flags (started here through
`multiprocessing`'s spawn, so the clients' threads never share its interpreter) and, with `--peer`, llama-server
with N slots, plainly and with the pair's draft. Each round, for each client count and each server in turn (the order
rotating round by round), C clients send one chat request each at the same moment (greedy, `tokens` tokens, the
prompts taken in turn) and the round records the aggregate tok/s — every completion token over the wall time from
the first send to the last answer — and the clients' mean latency (send to whole answer). The report gives the
medians over the rounds. With `--structured` every request asks for a JSON schema's answer (`response_format`), and a
second localspec server runs beside the first whose requests with a grammar draft only while they run alone
(`LOCALSPEC_SHARED_DRAFTS=off`, as before issue 65): the yardstick of drafting in the shared batch. DESIGN §8 says
how the server batches the clients; docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import statistics
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from localspec.core.slots import SHARED_DRAFTS_ENV
from localspec.errors import LocalspecError
from localspec.models.flags import RunFlags
from localspec.paths import Paths

from .peer import LlamaServer, PeerError, _free_port, find_llama_server
from .report import machine_line
from .run import STRUCTURED_SCHEMA


class ServeError(LocalspecError):
    """localspec's server for the bench did not start or did not answer (the message says why, in one line)."""


@dataclass(frozen=True, slots=True)
class ClientsPlan:
    """What `bench --clients` runs (checked flags)."""

    flags: RunFlags
    paths: Paths
    clients: tuple[int, ...]  # client counts, each a workload
    parallel: int  # slots of each server: localspec's --parallel, llama-server's -np
    prompts: tuple[str, ...]
    tokens: int  # max_tokens of each request
    rounds: int
    peer: str | None  # llama-server's path or folder ("": on PATH; None: no peer)
    command: str
    serve: Callable  # runs localspec's server in the child process (`LocalServer`)
    structured: bool = False  # every answer constrained to a JSON schema; beside it, a server drafting those alone


@dataclass(frozen=True, slots=True)
class ClientsRow:
    server: str  # "localspec --parallel 4", "llama-server -np 4", "llama-server -np 4 -md"
    clients: int
    tokens_per_second: float  # aggregate, the median over the rounds
    latency: float  # seconds from send to whole answer, the clients' mean, the median over the rounds
    ratio: float | None  # localspec's tok/s over this server's at the same client count (None: localspec's row)
    per_round: tuple[float, ...] = ()  # its aggregate tok/s in each round, in order


@dataclass(slots=True)
class ClientsReport:
    command: str
    machine: str
    date: str
    parallel: int
    tokens: int
    rounds: int
    structured: bool = False
    rows: list[ClientsRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


LOCAL = "localspec --parallel {n}"
ALONE = "localspec --parallel {n}, grammar drafts alone"  # `--structured`'s yardstick (LOCALSPEC_SHARED_DRAFTS=off)
STARTUP_SECONDS = 600.0  # a large pair on a slow disk: loading is what it waits for


class LocalServer:
    """localspec's server in a process of its own. Use as a context manager.

    Args:
        serve: runs the server: serve(flags, paths, parallel, port) (`cli.serve.serve_in_child`: the server layer is
            the command line's to start, not the bench's); a module-level function, as the spawned process imports it.

    Raises:
        ServeError: the process ended before it answered /health, or it did not answer in time.
    """

    def __init__(
        self, serve: Callable, flags: RunFlags, paths: Paths, parallel: int, env: dict[str, str] | None = None
    ) -> None:
        self.port = _free_port()
        context = multiprocessing.get_context("spawn")  # no inherited threads or llama.cpp state
        flags = dataclasses.replace(flags, overrides=dict(flags.overrides))  # picklable (a read-only view is not)
        args = (serve, env or {}, flags, paths, parallel, self.port)
        self._process = context.Process(target=_serve_with_env, args=args, daemon=True)

    def __enter__(self) -> LocalServer:
        self._process.start()
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if not self._process.is_alive():
                raise ServeError(
                    f"localspec serve exited at start (code {self._process.exitcode}): run `localspec serve` with "
                    "the same flags to see why"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.__exit__()
        raise ServeError(f"localspec serve did not become ready within {STARTUP_SECONDS:.0f} s")

    def __exit__(self, *exc) -> None:
        if self._process.is_alive():
            self._process.terminate()  # SIGTERM: the server stops its generations and exits
            self._process.join(30)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()


def _serve_with_env(serve: Callable, env: dict[str, str], *args) -> None:  # pragma: no cover - a child process
    """`serve(*args)` in the child, with `env` added to its environment first."""
    os.environ.update(env)
    serve(*args)


def model_id(port: int) -> str:
    """The name the server gives its model (`/v1/models`), which its requests then name.

    Raises:
        PeerError: no answer, or no model listed.
    """
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as r:
            return str(json.load(r)["data"][0]["id"])
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
        raise PeerError(f"the server did not list its model: {e}") from e


def ask(port: int, model: str, prompt: str, tokens: int, schema: dict | None = None) -> tuple[float, int]:
    """One greedy chat request (its answer in `schema` where one is given): (seconds from send to the whole answer,
    completion tokens).

    Raises:
        PeerError: no answer, or one without usage.
    """
    body: dict = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens}
    body |= {"temperature": 0, "stream": False}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=1800) as r:
            answer = json.load(r)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise PeerError(f"the server did not answer a chat request: {e}") from e
    try:
        return time.perf_counter() - t0, int(answer["usage"]["completion_tokens"])
    except (KeyError, TypeError, ValueError):
        raise PeerError("the server's answer has no usage.completion_tokens") from None


def together(
    port: int, model: str, prompts: Sequence[str], tokens: int, schema: dict | None = None
) -> tuple[float, float]:
    """Every prompt sent at the same moment, one client each: (aggregate tok/s, the clients' mean latency).

    Raises:
        PeerError: a client got no answer.
    """
    out: list[tuple[float, int] | BaseException | None] = [None] * len(prompts)

    def client(i: int) -> None:
        try:
            out[i] = ask(port, model, prompts[i], tokens, schema)
        except BaseException as e:  # said by the caller, not lost in the thread
            out[i] = e

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(prompts))]
    t0 = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - t0
    for result in out:
        if isinstance(result, BaseException):
            raise result if isinstance(result, PeerError) else PeerError(f"a client failed: {result}")
    answers = [r for r in out if isinstance(r, tuple)]
    return sum(n for _, n in answers) / wall, statistics.mean(s for s, _ in answers)


def run_clients(plan: ClientsPlan, show: Callable[[str], None] = lambda _: None) -> ClientsReport:
    """Start the servers, run every workload round by round, stop them; the report of the medians.

    Raises:
        LocalspecError: localspec's server did not start (llama-server's failures are notes in the report).
    """
    n = plan.parallel
    report = ClientsReport(
        plan.command, machine(plan.flags), now(), n, plan.tokens, plan.rounds, structured=plan.structured
    )
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    schema = STRUCTURED_SCHEMA if plan.structured else None
    with started_servers(
        plan.serve, plan.flags, plan.paths, n, plan.peer, report.notes, show, yardstick=plan.structured
    ) as servers:
        names = list(servers)
        for name, server in servers.items():  # warm-up: every slot used once, not measured
            show(f"warming {name}")
            together(server.port, server.model, _prompts(plan.prompts, n, 0), 8, schema)
        for r in range(plan.rounds):
            for clients in plan.clients:
                for name in rotated(names, r):
                    show(f"round {r + 1}/{plan.rounds}: {clients} client{'s' * (clients > 1)} on {name}")
                    prompts = _prompts(plan.prompts, clients, r)
                    rate = together(servers[name].port, servers[name].model, prompts, plan.tokens, schema)
                    results.setdefault((name, clients), []).append(rate)
    for clients in plan.clients:
        ours = statistics.median(rate for rate, _ in results[(LOCAL.format(n=n), clients)])
        for name in names:
            runs = results[(name, clients)]
            rate = statistics.median(x for x, _ in runs)
            latency = statistics.median(y for _, y in runs)
            ratio = None if name == LOCAL.format(n=n) else ours / rate
            report.rows.append(ClientsRow(name, clients, rate, latency, ratio, tuple(x for x, _ in runs)))
    return report


@dataclass(frozen=True, slots=True)
class Served:
    """One started server: its port and the name its requests give its model."""

    port: int
    model: str


@contextmanager
def started_servers(
    serve: Callable,
    flags: RunFlags,
    paths: Paths,
    parallel: int,
    peer: str | None,
    notes: list[str],
    show: Callable[[str], None],
    *,
    yardstick: bool = False,
) -> Iterator[dict[str, Served]]:
    """localspec's server (`LOCAL`) and, with a peer, llama-server with as many slots, plainly and with the pair's
    draft where it has one: name → `Served`, localspec's first; every one stopped on leaving. `bench --clients` and
    `bench --agents` drive them alike.

    Args:
        serve: runs localspec's server in the child process (see `LocalServer`).
        peer: llama-server's path or folder ("": on PATH; None: no peer).
        notes: told why a llama-server did not run (the bench goes on without it).
        yardstick: also localspec's server with grammar drafts alone (`ALONE`, `--structured`).

    Raises:
        LocalspecError: localspec's server did not start.
    """
    from localspec.models.loading import load_params, resolve_models

    resolved = resolve_models(flags, paths)
    running: dict[str, object] = {}
    try:
        show("starting localspec serve")
        running[LOCAL.format(n=parallel)] = LocalServer(serve, flags, paths, parallel).__enter__()
        if yardstick:
            off = {SHARED_DRAFTS_ENV: "off"}
            running[ALONE.format(n=parallel)] = LocalServer(serve, flags, paths, parallel, off).__enter__()
        if peer is not None:
            params = load_params(flags, resolved.defaults, has_draft=True)
            _start_peers(peer, parallel, flags, resolved, params, running, notes)
        yield {name: Served(server.port, model_id(server.port)) for name, server in running.items()}
    finally:
        for server in running.values():
            server.__exit__(None, None, None)
        show("")


def rotated(names: Sequence[str], r: int) -> list[str]:
    """The servers' order in round r: each round starts one later, so no server always goes first."""
    return [*names[r % len(names) :], *names[: r % len(names)]]


def machine(flags: RunFlags) -> str:
    return machine_line(flags.threads or os.cpu_count() or 1)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _prompts(prompts: Sequence[str], clients: int, offset: int) -> list[str]:
    return [prompts[(offset + i) % len(prompts)] for i in range(clients)]


def _start_peers(peer: str, parallel: int, flags: RunFlags, resolved, params, servers: dict, notes: list[str]) -> None:
    """llama-server with N slots, plain and with the pair's draft, where it runs (else a note)."""
    try:
        binary = find_llama_server(peer or None)
    except PeerError as e:
        notes.append(f"llama-server not run: {e}")
        return
    n, n_ctx = parallel, params.n_ctx or 4096
    template = flags.chat_template or resolved.defaults.chat_template
    threads = flags.threads or os.cpu_count() or 1
    drafts = [None] if resolved.draft is None else [None, str(resolved.draft)]
    for draft in drafts:
        name = f"llama-server -np {n}" + (" -md" if draft else "")
        server = LlamaServer(
            binary,
            str(resolved.target),
            draft,
            k=None,
            probabilistic=None,
            threads=threads,
            n_ctx=n_ctx,
            parallel=n,
            chat_template=template,
        )
        try:
            server.start()
        except PeerError as e:
            notes.append(f"{name} not run: {e}")
            continue
        servers[name] = server


def render_clients(report: ClientsReport) -> list[str]:
    """The report as text: what ran, then one row per server and client count."""
    lines = [
        f"localspec bench --clients — {report.date} — {report.machine}",
        f"{report.command}",
        f"each client: one greedy chat request of up to {report.tokens} tokens"
        f"{', its answer in a JSON schema' if report.structured else ''}, all sent at once; "
        f"median of {report.rounds} round{'s' * (report.rounds > 1)}, servers interleaved",
        "",
    ]
    width = max([28, *(len(row.server) for row in report.rows)])  # the yardstick's name is the longest
    lines.append(f"{'server':<{width}} {'clients':>7} {'tok/s':>8} {'localspec ×':>12} {'latency s':>10}")
    for row in report.rows:
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}"
        rate, latency = f"{row.tokens_per_second:>8.1f}", f"{row.latency:>10.2f}"
        lines.append(f"{row.server:<{width}} {row.clients:>7} {rate} {ratio:>12} {latency}")
    lines += rounds_lines(report.rows)
    lines += [f"note: {note}" for note in report.notes]
    return lines


def rounds_lines(rows: Sequence[ClientsRow]) -> list[str]:
    """localspec's ratio to each server round by round (the servers take turns within a round, so a round's ratio
    is measured in the same minutes): how far the median's rounds scatter."""
    ours = {row.clients: row.per_round for row in rows if row.ratio is None}
    lines = []
    for row in rows:
        mine = ours.get(row.clients, ())
        if row.ratio is None or len(row.per_round) < 2 or len(mine) != len(row.per_round):
            continue
        ratios = ", ".join(f"{a / b:.2f}" if b else "–" for a, b in zip(mine, row.per_round, strict=True))
        lines.append(f"localspec × {row.server}, {row.clients} client{'s' * (row.clients > 1)}, by round: {ratios}")
    return lines


def clients_json(report: ClientsReport) -> str:
    return json.dumps(asdict(report), indent=2)
