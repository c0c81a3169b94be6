"""`localspec worker`: serve this machine's devices to a localspec elsewhere (llama.cpp's RPC server).

The chat on the other machine puts its target's layers here with `--rpc HOST:PORT` (or `rpc = [...]` in its pair);
its draft stays there. RPC has no authentication, so the worker binds the loopback interface unless told otherwise.
"""

from __future__ import annotations

import argparse
import errno
import socket
import sys
import threading
from pathlib import Path

from localspec.errors import InvalidParamsError, RpcError
from localspec.llama import rpc, threads
from localspec.paths import Paths

from .interrupts import Interrupted, SignalGuard


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "worker",
        help="serve this machine's devices to a localspec on another machine (RPC)",
        description="Serve this machine's devices to a target loaded elsewhere, as a llama.cpp RPC worker. "
        "Docs: docs/models.md.",
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=rpc.DEFAULT_PORT, help=f"TCP port (default {rpc.DEFAULT_PORT})")
    p.add_argument("--threads", type=int, help="CPU threads when serving the CPU (default: one per physical core)")
    p.add_argument(
        "--cache",
        nargs="?",
        const="",
        metavar="DIR",
        help="keep the weights clients send in DIR, so loading the same model again skips the transfer "
        "(DIR default: localspec's data folder/rpc-cache)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, paths: Paths) -> int:
    reason = rpc.support()
    if reason:
        raise RpcError(reason)
    if not 0 < args.port < 65536:
        raise InvalidParamsError(f"--port {args.port} is not a TCP port: use 1 to 65535")
    if args.threads is not None and args.threads < 1:
        raise InvalidParamsError(f"--threads {args.threads}: use 1 or more")
    endpoint = rpc.Endpoint(args.host, args.port)
    _check_bind(endpoint)
    cache = None
    if args.cache is not None:
        folder = paths.rpc_cache_dir if args.cache == "" else args.cache
        if Path(folder).exists() and not Path(folder).is_dir():
            raise InvalidParamsError(f"--cache {folder} is a file, not a folder: give a folder (made if missing)")
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InvalidParamsError(
                f"cannot use --cache {folder} ({e.strerror}): give a folder you can write (made if missing)"
            ) from None
        cache = str(folder)
    if not endpoint.is_local:
        print(
            f"localspec worker: warning: RPC has no authentication — anyone who can reach {endpoint} can use this "
            "machine's devices; serve only a private network, or keep the default 127.0.0.1 and use an SSH tunnel",
            file=sys.stderr,
        )
    names = ", ".join(name for _, name in rpc.local_devices())
    n_threads = args.threads or threads.physical_cores()
    version = ".".join(map(str, rpc.PROTOCOL))
    print(f"localspec worker: serving {names} on {endpoint} (RPC protocol {version}); stop with Ctrl+C", flush=True)
    server = threading.Thread(target=rpc.serve, args=(endpoint,), kwargs={"threads": n_threads, "cache_dir": cache})
    server.daemon = True  # llama.cpp's server loop never returns; Ctrl+C or SIGTERM ends the process
    # The guard also takes SIGINT where the shell that started us in the background ignores it.
    with SignalGuard():
        server.start()
        try:
            while server.is_alive():
                server.join(0.5)
        except Interrupted:
            print("localspec worker: stopped", file=sys.stderr)
            return 0
    raise RpcError(f"the RPC server on {endpoint} stopped: see the lines above")


def _check_bind(endpoint: rpc.Endpoint) -> None:
    """A one-line error now, rather than llama.cpp's 'Failed to create server socket' later: it says whether the
    host or the port is what to change."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((endpoint.host, endpoint.port))
    except OSError as e:
        reason = e.strerror or type(e).__name__
        if isinstance(e, socket.gaierror) or e.errno == errno.EADDRNOTAVAIL:
            raise RpcError(
                f"cannot listen on --host {endpoint.host} ({reason}): it is not an address of this machine; use "
                "0.0.0.0 for every network, 127.0.0.1 for this machine only, or one of its own IP addresses"
            ) from None
        if e.errno == errno.EACCES:
            raise RpcError(
                f"cannot listen on {endpoint} ({reason}): ports below 1024 need privileges; pick --port 50052 or "
                "another above 1023"
            ) from None
        raise RpcError(
            f"cannot listen on {endpoint} ({reason}): port {endpoint.port} is taken; pick another --port, or stop "
            "what uses it"
        ) from None
