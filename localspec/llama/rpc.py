"""The target on llama.cpp RPC workers: endpoints, the handshake probe, the worker, and surviving a lost worker.

`localspec worker` serves this machine's devices with llama.cpp's RPC server; `attach(endpoints)` makes their
devices available to one target model (the draft stays local). llama.cpp's RPC client aborts the whole process
when a worker is unreachable, speaks another protocol version, or dies mid-request. So:

- before llama.cpp connects, `probe` connects itself and does the HELLO handshake with a timeout, which turns the
  first two into one-line errors;
- every native call on a remote model runs on the `Remote`'s own daemon thread. An abort inside ggml-rpc is
  trapped (`ggml_set_abort_callback`): the aborting thread is parked for good instead of ending the process,
  and whoever waits on the remote gets `WorkerLostError`. The parked threads, and the lost model's native
  memory, stay behind until the process exits: nothing can be freed through a dead connection.
- llama.cpp caches one connection per endpoint string for as long as a model uses it, and the lost model is never
  freed, so after a loss the same worker is reached through a new spelling of its port (leading zeros).
"""

from __future__ import annotations

import ctypes
import ipaddress
import logging
import queue
import re
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localspec.errors import InvalidParamsError, RpcError, WorkerLostError

log = logging.getLogger(__name__)

DEFAULT_PORT = 50052
PROTOCOL = (7, 0, 0)  # RPC_PROTO_*_VERSION of the llama.cpp that llama-cpp-python==0.3.36 vendors
_HELLO = 14  # RPC_CMD_HELLO, fixed across protocol versions
_CAPS = 24  # RPC_CONN_CAPS_SIZE: transport capabilities; all zero = plain TCP
REBUILD = "packaging/reinstall-llama-backend.sh rpc --python .venv/bin/python"


# llama.cpp's RPC client splits an endpoint at its first ':' and resolves the host by name: no IPv6 literals.
_ENDPOINT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*:(\d{1,5})$")


def parse_rpc(text: str, source: str = "--rpc") -> tuple[str, ...]:
    """The endpoints of a comma-separated "host:port[,host:port…]" list.

    Raises:
        InvalidParamsError: an entry is not host:port with a port in 1..65535 (one line naming `source`).
    """
    endpoints = tuple(part.strip() for part in text.split(","))
    for endpoint in endpoints:
        check_endpoint(endpoint, source)
    if len(set(endpoints)) != len(endpoints):
        raise InvalidParamsError(f"{source}: {text!r} names a worker twice: give each host:port once")
    return endpoints


def check_endpoint(endpoint: str, source: str = "rpc") -> str:
    """`endpoint` when it has the form host:port (a name or an IPv4 address), else an InvalidParamsError."""
    match = _ENDPOINT_RE.match(endpoint) if isinstance(endpoint, str) else None
    if match is None or not 1 <= int(match.group(1)) <= 65535:
        raise InvalidParamsError(
            f"{source}: {endpoint!r} is not an RPC endpoint: write host:port with a port from 1 to 65535, "
            "e.g. 192.168.1.10:50052"
        )
    return endpoint


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A worker's address."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """'host:port', checked by `check_endpoint` (which owns the form)."""
        host, _, port = check_endpoint(text.strip()).rpartition(":")
        return cls(host, int(port))

    @property
    def is_local(self) -> bool:
        try:
            return ipaddress.ip_address(socket.gethostbyname(self.host)).is_loopback
        except (OSError, ValueError):
            return False


# --- the build ---------------------------------------------------------------------------------------------


def _lib() -> ctypes.CDLL | None:
    """ggml's functions when this build has the RPC backend, else None."""
    from .devices import native  # not at import: the endpoint form is read without loading llama.cpp

    lib = native()
    return lib if hasattr(lib, "ggml_backend_rpc_add_server") else None


def support() -> str | None:
    """None when this llama.cpp build has the RPC backend, else the one-line reason with the fix."""
    if _lib() is None:
        return f"this llama.cpp build has no RPC backend: rebuild it with `{REBUILD}`"
    return None


def _require() -> ctypes.CDLL:
    lib = _lib()
    if lib is None:
        raise RpcError(support() or "")
    lib.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    lib.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_rpc_start_server.restype = None
    lib.ggml_backend_rpc_start_server.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_void_p),
    ]
    return lib


# --- the handshake -----------------------------------------------------------------------------------------


def probe(endpoint: Endpoint, *, timeout: float = 5.0) -> tuple[int, int, int]:
    """Connect and do the HELLO handshake; return the worker's protocol version.

    Raises:
        RpcError: unreachable, busy (the worker serves one client at a time), not an RPC worker, or a protocol
            version this build cannot speak.
    """
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise RpcError(
            f"cannot reach the RPC worker at {endpoint} ({reason}): start `localspec worker --port {endpoint.port}` "
            "there, or fix --rpc / the pair's rpc entry"
        ) from None
    with sock:
        try:
            sock.sendall(struct.pack("<BQ", _HELLO, _CAPS) + bytes(_CAPS))
            reply = _recv(sock, 8)
            (size,) = struct.unpack("<Q", reply)
            version = tuple(_recv(sock, size)[:3]) if 3 <= size <= 4096 else ()
        except TimeoutError:
            raise RpcError(
                f"the RPC worker at {endpoint} accepted the connection but did not answer within {timeout:g} s: "
                "it serves one client at a time — close the other client, or start another worker"
            ) from None
        except OSError as e:
            raise RpcError(
                f"{endpoint} closed the connection in the handshake ({e.strerror or e}): is it a `localspec worker`?"
            ) from None
    if len(version) != 3:
        raise RpcError(f"{endpoint} did not answer like a llama.cpp RPC worker: check the port")
    if version[0] != PROTOCOL[0] or version[1] > PROTOCOL[1]:
        theirs, ours = ".".join(map(str, version)), ".".join(map(str, PROTOCOL))
        raise RpcError(
            f"the RPC worker at {endpoint} speaks protocol {theirs}, this build speaks {ours}: run the same "
            "localspec (and llama-cpp-python) version on both machines"
        )
    return version  # type: ignore[return-value]


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("closed")
        data += chunk
    return data


# --- losing a worker ---------------------------------------------------------------------------------------


class _Losses:
    """What llama.cpp's RPC client aborted with; the number of losses spells endpoints afresh."""

    def __init__(self) -> None:
        self.count = 0
        self.messages: list[str] = []
        self.lock = threading.Lock()
        self.callback: Any = None

    def install(self) -> None:
        if self.callback is not None:
            return
        from .devices import native

        base = native()
        kind = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
        self.callback = kind(self._on_abort)  # kept alive as long as the process
        base.ggml_set_abort_callback.restype = ctypes.c_void_p
        base.ggml_set_abort_callback.argtypes = [kind]
        base.ggml_set_abort_callback(self.callback)

    def _on_abort(self, message: bytes) -> None:
        text = message.decode("utf-8", errors="replace").strip()
        if "ggml-rpc" not in text:
            log.critical("llama.cpp aborts: %s", text)  # with the hook set, ggml prints nothing itself
            return  # not ours: llama.cpp aborts as it always did
        with self.lock:
            self.count += 1
            self.messages.append(text)
        log.error("RPC worker lost: %s", text)
        threading.Event().wait()  # park this thread for good: returning would abort() the whole process


_losses = _Losses()


class Remote:
    """The RPC devices one target model is placed on, and the daemon thread its native calls run on.

    `call(fn, *args)` runs fn there and waits; when a worker is lost meanwhile it raises `WorkerLostError` and
    the remote is `lost` for good (its model and context are then abandoned, never freed). llama.cpp's abort does
    not say which connection died, so a loss counts for every remote that existed when it happened.
    """

    def __init__(self, endpoints: tuple[Endpoint, ...]) -> None:
        self.endpoints = endpoints
        self.devices: list[int] = []  # ggml device handles, filled by `attach`
        self._losses_at_start = _losses.count
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="localspec-rpc", daemon=True)
        self._thread.start()

    @property
    def lost(self) -> bool:
        return _losses.count > self._losses_at_start

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, box, done = job
            try:
                box.append((True, fn(*args)))
            except BaseException as e:  # handed to the caller
                box.append((False, e))
            done.set()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.lost:
            raise self._error()
        box: list = []
        done = threading.Event()
        self._jobs.put((fn, args, box, done))
        while not done.wait(0.05):
            if self.lost:
                raise self._error()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Stop the thread (after the model and context are freed)."""
        if not self.lost:
            self._jobs.put(None)

    def _error(self) -> WorkerLostError:
        where = ", ".join(map(str, self.endpoints))
        detail = _losses.messages[-1].rpartition(": ")[2] if _losses.messages else "connection lost"
        return WorkerLostError(where, detail)


def attach(endpoints: tuple[Endpoint, ...], *, timeout: float = 5.0) -> Remote:
    """Check the build and each worker, then register their devices for one model load.

    Raises:
        RpcError: no RPC in this build, a worker unreachable, busy or on another protocol version.
    """
    lib = _require()
    _losses.install()
    for endpoint in endpoints:
        probe(endpoint, timeout=timeout)
    lib.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    remote = Remote(endpoints)
    try:
        for endpoint in endpoints:
            # A new spelling per loss: llama.cpp keeps the lost connection cached under the old one.
            alias = f"{endpoint.host}:{'0' * _losses.count}{endpoint.port}"
            # On the remote's thread: registering connects, and a worker gone since the probe aborts there.
            reg = remote.call(lib.ggml_backend_rpc_add_server, alias.encode())
            if not reg:
                raise RpcError(f"the RPC worker at {endpoint} offers no devices: check how it was started")
            remote.devices += [lib.ggml_backend_reg_dev_get(reg, i) for i in range(lib.ggml_backend_reg_dev_count(reg))]
    except BaseException:
        remote.close()
        raise
    return remote


# --- the worker --------------------------------------------------------------------------------------------


def local_devices() -> list[tuple[int, str]]:
    """(handle, name) of the devices a worker serves: the GPUs when there are any, else the CPU."""
    from .devices import device_handles

    found = device_handles()
    gpus = [(h, d.name) for h, d in found if d.kind in ("gpu", "igpu")]
    return gpus or [(h, d.name) for h, d in found if d.kind == "cpu"]


def serve(endpoint: Endpoint, *, threads: int, cache_dir: str | None) -> None:
    """Serve this machine's devices on `endpoint` until the process ends (llama.cpp's RPC server; blocks)."""
    lib = _require()
    devices = local_devices()
    array = (ctypes.c_void_p * len(devices))(*[h for h, _ in devices])
    lib.ggml_backend_rpc_start_server(
        str(endpoint).encode(), cache_dir.encode() if cache_dir else None, threads, len(devices), array
    )
