"""`localspec serve`: the engine behind an OpenAI-compatible HTTP server (uvicorn), for editors and chat clients.

The model, load and sampling flags are `generate`'s (`flags`, checked by `checks`); the flags' sampling values
become every request's defaults, over the pair's. It binds 127.0.0.1 unless told otherwise and says so loudly when
another address serves without `--api-key`. SIGINT / SIGTERM stop it: running generations end after their
current step, open streams are closed, the engine is freed. `--status` asks a running server instead (its
/health, and /v1/models for the pairs it could load) and prints a table of its pairs.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import socket
import sys
from pathlib import Path

from localspec.errors import InvalidParamsError, LocalspecError
from localspec.paths import Paths

from .checks import check_run_args
from .flags import add_model_args, add_sampling_args
from .interrupts import SignalGuard
from .textinput import clean

DEFAULT_PORT = 8080
DEFAULT_QUEUE = 8
DEFAULT_PARALLEL = "auto"
DEFAULT_TIMEOUT = 30.0  # as server/app.py TIMEOUT_S (this module imports no server code before a serve runs)


def register(sub) -> None:
    """Add `serve` to the `localspec` command."""
    p = sub.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server (chat, completions, responses, Anthropic messages, embeddings)",
        description="Serve pairs over HTTP with OpenAI's chat and completions API, decoding speculatively: every "
        "pair of models.toml, each loaded when a request first names it. Docs: docs/serve.md.",
        conflict_handler="resolve",  # --pair again, repeatable here
    )
    add_model_args(p)
    p.add_argument(
        "--pair",
        action="append",
        metavar="NAME",
        help="a pair from models.toml (see `localspec models`): the default, loaded at start; repeat it to serve only "
        "those pairs, the first the default (default: models.toml's default pair first, and every pair whose files "
        "are here)",
    )
    add_sampling_args(p)
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1: this machine)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every request but /health")
    p.add_argument(
        "--cors",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let a web page from ORIGIN (e.g. http://localhost:3000) read responses (repeatable; default: none; "
        "'*', any page, only with --api-key)",
    )
    p.add_argument(
        "--no-swap", action="store_true", help="refuse requests for another pair (default: load it, like Ollama)"
    )
    p.add_argument(
        "--max-loaded",
        type=int,
        default=0,
        metavar="N",
        help="most pairs loaded at once; loading another unloads the least recently used idle one (default: no count)",
    )
    p.add_argument(
        "--max-memory",
        metavar="SIZE",
        help="most memory the loaded pairs' plans may take together, e.g. 24G; past it the least recently used idle "
        "pair is unloaded first (default: what the host has available when a pair loads)",
    )
    p.add_argument(
        "--keep-alive",
        default="-1",
        metavar="DURATION",
        help="unload a pair idle this long (300, 30s, 5m, 1h; a request's keep_alive sets its pair's; default: never)",
    )
    p.add_argument(
        "--load-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="seconds a request waits for its pair to load, then 503 (default 300)",
    )
    p.add_argument(
        "--queue",
        type=int,
        default=DEFAULT_QUEUE,
        help=f"most requests waiting or running; past it, 503 with Retry-After (default {DEFAULT_QUEUE})",
    )
    p.add_argument(
        "--parallel",
        default=DEFAULT_PARALLEL,
        metavar="N",
        help="most requests generating at once (a count, or auto), decoded together in one batch, sharing one pool "
        "of --n-ctx KV cells (each up to --n-ctx tokens while cells are free); a request alone still speculates "
        "(default auto: 4, 1 where the target cannot take several streams — a recurrent or hybrid model, an MTP "
        "head)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="seconds a client has to send a request's head, and again its body; a slower one is dropped "
        f"(default {DEFAULT_TIMEOUT:g})",
    )
    p.add_argument(
        "--embedding-model",
        metavar="PATH",
        help="a GGUF embedding model for /v1/embeddings, loaded on first use (default: an embeddings context over "
        "the target)",
    )
    p.add_argument(
        "--allow-image-urls",
        action="store_true",
        help="fetch an image a request names by http(s) URL, and read one it names by local path or file: URL, as "
        "this server's user (default: only images sent inline as data URLs or base64)",
    )
    p.add_argument(
        "--status",
        action="store_true",
        help="ask the server running on --host/--port (with its --api-key) which pairs it has loaded, their memory, "
        "slots and queue, and which it could load; print them and exit (exit 1: no server answers)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, paths: Paths) -> int:
    """Check the flags, load the default pair, serve until SIGINT / SIGTERM (`--status`: print a running server's
    pairs instead)."""
    if args.status:
        return _status(args)
    chosen = list(dict.fromkeys(args.pair or ()))
    args.pair = chosen[0] if chosen else None
    flags = check_run_args(args)
    if args.max_loaded < 0:
        raise InvalidParamsError(f"--max-loaded {args.max_loaded} is out of range: use 1 or more, or 0 for no count")
    if not 0 < args.load_timeout <= 86400:
        raise InvalidParamsError(f"--load-timeout {args.load_timeout:g} is out of range: use more than 0")
    if not 0 < args.port < 65536:
        raise InvalidParamsError(f"--port {args.port} is not a TCP port: use 1 to 65535")
    if not 1 <= args.queue <= 10_000:
        raise InvalidParamsError(f"--queue {args.queue} is out of range: use 1 to 10000")
    if not 0 < args.timeout <= 3600:
        raise InvalidParamsError(f"--timeout {args.timeout:g} is out of range: use more than 0 and at most 3600")
    parallel = _parallel(args.parallel)
    api_key = clean(args.api_key)[0] if args.api_key is not None else None
    if api_key is not None and not api_key.strip():
        raise InvalidParamsError("--api-key is empty: give a key, or leave the flag out")
    if "*" in args.cors and api_key is None:
        raise InvalidParamsError(
            "--cors '*' would let any web page you visit drive this server and read its answers: name the origins "
            "(--cors http://localhost:3000), or require a key with --api-key KEY"
        )
    from localspec.server.app import ServerSettings, is_loopback
    from localspec.server.pairs import Pairs
    from localspec.server.units import parse_duration, parse_size

    max_memory = parse_size(args.max_memory) if args.max_memory is not None else 0
    keep_alive = parse_duration(args.keep_alive)

    embedding_model = None
    if args.embedding_model is not None:
        from localspec.llama.model import check_gguf_file

        check_gguf_file(Path(args.embedding_model))  # a wrong path is one line now, not an error per request
        embedding_model = str(Path(args.embedding_model).expanduser())
    settings = ServerSettings(
        host=args.host,
        api_key=api_key,
        cors=tuple(args.cors),
        embedding_model=embedding_model,
        timeout=args.timeout,
        allow_image_urls=args.allow_image_urls,
    )
    _check_bind(args.host, args.port)  # before a model loads (a busy port costs no wait) and before any warning
    if not is_loopback(args.host) and api_key is None:
        print(
            f"localspec serve: warning: no authentication — anyone who can reach {args.host}:{args.port} can use "
            "this server; pass --api-key KEY, or keep the default 127.0.0.1",
            file=sys.stderr,
        )
    if flags.think is not None:
        _check_think(flags, paths)  # before the weights load, as the port: one line, not an error per request
    _log_to_stderr()
    # A models.toml that cannot be read is said once: by the load when it serves a pair, as a warning for --target.
    pairs = _configured_pairs(paths, warn=flags.target is not None)
    runner = Pairs(
        flags,
        paths,
        names=[*chosen, *(p for p in pairs if p not in chosen)],
        no_swap=args.no_swap or len(chosen) > 1,
        chosen=chosen,
        max_queue=args.queue,
        parallel=parallel,
        max_loaded=args.max_loaded,
        max_memory=max_memory,
        keep_alive=keep_alive,
        load_timeout=args.load_timeout,
    )
    # uvicorn re-raises the signal that stopped it; the guard turns it into exit code 130 / 143 (main prints it).
    with SignalGuard():
        try:
            _serve(runner, settings, args)
        finally:
            runner.close()
    return 0


def serve_in_child(flags, paths: Paths, parallel: int, port: int) -> None:  # pragma: no cover - a child process
    """`localspec serve --parallel N` on 127.0.0.1:port with these checked flags, in a process of its own
    (`bench --clients`, bench/clients.py): a refusal is one line and exit code 2, Ctrl+C exit code 130."""
    from localspec.server.app import ServerSettings, serve
    from localspec.server.pairs import Pairs

    logging.basicConfig(level=logging.WARNING)
    runner = Pairs(flags, paths, parallel=parallel)
    try:
        runner.start()
        serve(runner, ServerSettings(), port)
    except LocalspecError as e:  # as `localspec serve` says it; the bench then says the server exited
        print(f"localspec serve: error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl+C reaches the whole process group: the bench reports it
        sys.exit(130)
    finally:
        runner.close()


def _parallel(value: str) -> int:
    """--parallel as the runner takes it: a count of 1 to 64, or 0 for auto.

    Raises:
        InvalidParamsError: neither.
    """
    text = str(value).strip().lower()
    if text == "auto":
        return 0
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise InvalidParamsError(f"--parallel {value} is out of range: use 1 to 64, or auto")
    return int(text)


def _check_think(flags, paths: Paths) -> None:
    """Refuse a `--think` the model cannot follow, from its vocabulary and chat template alone (no weights loaded).

    Raises:
        LocalspecError: the model has no switch for "off", or does not think for "on".
    """
    from localspec.core.session import ChatFormat
    from localspec.core.thinking_support import choose_thinking, thinking_choice
    from localspec.llama.model import Model
    from localspec.models.loading import resolve_models

    resolved = resolve_models(flags, paths)
    with Model(resolved.target, n_gpu_layers=0, vocab_only=True) as model:
        fmt = ChatFormat(model, flags.chat_template or resolved.defaults.chat_template)
        name = resolved.name or resolved.target.name
        choose_thinking(fmt.thinking, name, thinking_choice(flags.think, "serve"))


def _serve(runner, settings, args: argparse.Namespace) -> None:
    from localspec.server.app import serve

    served = runner.start()
    default = runner.default_runner()
    assert default is not None  # `start` made it
    for note in (served.resolved.defaults.notice, served.engine.drafting_note, served.engine.slots_note):
        if note:
            print(f"localspec: note: {note}", file=sys.stderr)
    n, n_ctx = default.parallel, served.engine.n_ctx
    slots = f"{n} slots sharing one --n-ctx of {n_ctx} tokens" if n > 1 else f"1 slot of {n_ctx} tokens"
    others = len(runner.served_names()) - 1
    more = f"; {others} more pair{'s' * (others > 1)} on request" if others else ""
    print(
        f"localspec serve: {served.name} on http://{_url_host(args.host)}:{args.port}/v1 "
        f"(OpenAI-compatible, {slots}{more}); stop with Ctrl+C",
        file=sys.stderr,
        flush=True,
    )
    if not serve(runner, settings, args.port):
        raise LocalspecError(f"cannot listen on {args.host}:{args.port}: pick another --port, or stop what uses it")


def _status(args: argparse.Namespace) -> int:
    """Print the pairs of the server on --host/--port (0); one line on stderr when none answers there (1)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(args.host, args.host)  # where it listens
    where = f"http://{_url_host(host)}:{args.port}"
    key = clean(args.api_key)[0].strip() if args.api_key else None
    try:
        health = _ask(host, args.port, "/health", None)
        models = _ask(host, args.port, "/v1/models", key)
        if (
            not isinstance(health, dict)
            or not isinstance(health.get("pairs"), dict)
            or not isinstance(models, dict | None)
        ):
            raise ValueError("not localspec's /health")
    except (OSError, ValueError, http.client.HTTPException) as e:
        reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
        print(
            f"localspec serve: no localspec server answers on {where} ({reason}): start one with `localspec serve`, "
            "or give its --host and --port",
            file=sys.stderr,
        )
        return 1
    print(_status_table(health, models, where, keyed=key is not None))
    return 0


def _ask(host: str, port: int, path: str, key: str | None) -> dict | None:
    """GET `path` as JSON (an error status's body too: /health is 503 while loading); None for a 401 or 403."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    if response.status in (401, 403) and path != "/health":
        return None
    return json.loads(body)


def _status_table(health: dict, models: dict | None, where: str, *, keyed: bool = False) -> str:
    """The pairs loaded (or loading) as a table, then the others the server could load (`models` None: refused,
    with the key given when `keyed`)."""
    rows, waits = [("PAIR", "STATE", "MEMORY", "SLOTS", "QUEUE")], []
    for name, pair in health["pairs"].items():
        slots = pair.get("slots") or {}
        state = "loaded" if pair.get("loaded") else "waiting" if pair.get("waiting") else "loading"
        if isinstance(waiting := pair.get("waiting"), dict):
            waits.append(f"{name} waits for room ({waiting.get('limit')}): for {', '.join(waiting.get('pairs') or ())} "
                         "to finish and unload")  # fmt: skip
        rows.append((name, state, _size(pair.get("memory") or 0), f"{slots.get('busy', 0)}/{slots.get('total', 0)}",
                     str(pair.get("queue", 0))))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [f"localspec serve on {where}: {health.get('status', '?')}, default pair {health.get('model') or '-'}"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    if len(rows) == 1:
        lines.append("(no pair loaded)")
    lines += waits
    if models is None and keyed:
        lines.append("available: the server refused this --api-key (a wrong key): give the key it was started with")
    elif models is None:
        lines.append("available: give the server's --api-key to list them")
    else:
        data = [m for m in models.get("data", []) if m.get("id") not in health["pairs"]]
        names = [m["id"] for m in data if m.get("available")]
        lines.append(f"available: {', '.join(names) or 'none besides those loaded'}")
        lines += [f"damaged: {m['id']}: {m['damaged']}" for m in data if m.get("damaged")]
    return "\n".join(lines)


def _size(n: int) -> str:
    return "-" if n <= 0 else f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _check_bind(host: str, port: int) -> None:
    """A one-line error now (a busy port, an address not on this machine), rather than after loading."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(address)
    except OSError as e:
        raise LocalspecError(
            f"cannot listen on {host}:{port} ({e.strerror or e}): pick another --port or --host, or stop what uses it"
        ) from None


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _configured_pairs(paths: Paths, *, warn: bool = True) -> list[str]:
    """The pairs of models.toml a request may ask for (none when it cannot be read: --target files still serve)."""
    from localspec.models.catalog import load_config

    try:
        return sorted(load_config(paths).pairs)
    except LocalspecError as e:
        if warn:
            logging.getLogger("localspec.server").warning("no pairs to switch to: %s", e)
        return []


def _log_to_stderr() -> None:
    """The server's lines (requests, errors, pair loads) on stderr too, one line each; uvicorn's own likewise; and the
    prompt cache's warnings (a damaged file, a full or unwritable --cache-dir: once per cause, core/promptdisk.py)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    handler.setLevel(logging.INFO)
    warnings = logging.StreamHandler(sys.stderr)
    warnings.setFormatter(handler.formatter)
    warnings.setLevel(logging.WARNING)
    for name, each in (("localspec.server", handler), ("localspec.core.promptdisk", warnings)):
        logger = logging.getLogger(name)
        if not any(getattr(h, "_localspec_serve", False) for h in logger.handlers):
            each._localspec_serve = True  # type: ignore[attr-defined]
            logger.addHandler(each)
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.handlers = [handler]
    uvicorn_log.setLevel(logging.WARNING)
    uvicorn_log.propagate = False
